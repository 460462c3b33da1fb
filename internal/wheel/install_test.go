package wheel_test

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/csv"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
	"github.com/gpupass/gpupass/internal/wheel"
)

// buildWheel writes a wheel with files (archive path -> content) and a
// RECORD hashing each; exec names the entries stored with mode 0755.
func buildWheel(t *testing.T, dir, file, distInfo string, files map[string]string, exec map[string]bool, recordAs ...map[string]string) string {
	t.Helper()
	names := make([]string, 0, len(files))
	for k := range files {
		names = append(names, k)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var rec strings.Builder
	for _, n := range names {
		h := &zip.FileHeader{Name: n, Method: zip.Deflate}
		h.SetMode(0o644)
		if exec[n] {
			h.SetMode(0o755)
		}
		w, err := zw.CreateHeader(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(files[n]))
		content := files[n]
		if len(recordAs) > 0 {
			if c, ok := recordAs[0][n]; ok {
				content = c
			}
		}
		sum := sha256.Sum256([]byte(content))
		fmt.Fprintf(&rec, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(content))
	}
	fmt.Fprintf(&rec, "%s/RECORD,,\n", distInfo)
	w, _ := zw.Create(distInfo + "/RECORD")
	w.Write([]byte(rec.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, file)
	if err := os.WriteFile(p, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// tree lists the files under the venv an installer wrote (relative path
// -> mode and content, the venv's path replaced by VENV), leaving out
// what differs by design: bytecode, pip's REQUESTED, INSTALLER's content
// and the venv's own files.
func tree(t *testing.T, venv string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(venv, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		rel, _ := filepath.Rel(venv, p)
		base := filepath.Base(rel)
		if strings.Contains(rel, "__pycache__") || base == "REQUESTED" || base == "direct_url.json" || rel == "pyvenv.cfg" || strings.HasPrefix(rel, "bin/python") || strings.HasPrefix(rel, "bin/activate") || strings.HasPrefix(rel, "bin/Activate") {
			return nil
		}
		fi, err := os.Lstat(p)
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		body := strings.ReplaceAll(string(b), venv, "VENV")
		switch base {
		case "INSTALLER":
			body = "(installer)"
		case "RECORD":
			// Same rows, hash and size aside for the files whose content
			// differs by design.
			rows, err := csv.NewReader(strings.NewReader(body)).ReadAll()
			if err != nil {
				return err
			}
			var keep []string
			for _, r := range rows {
				if strings.Contains(r[0], "__pycache__") || strings.HasSuffix(r[0], "/REQUESTED") || strings.HasSuffix(r[0], "/INSTALLER") || strings.Contains(r[0], "/bin/") {
					keep = append(keep, r[0])
					continue
				}
				keep = append(keep, strings.Join(r, ","))
			}
			var filtered []string
			for _, k := range keep {
				if !strings.Contains(k, "__pycache__") && !strings.HasSuffix(k, "/REQUESTED") && !strings.Contains(k, "/direct_url.json") {
					filtered = append(filtered, k)
				}
			}
			sort.Strings(filtered)
			body = strings.Join(filtered, "\n")
		}
		out[rel] = fmt.Sprintf("%04o %s", fi.Mode().Perm()&0o111|0o644, body)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestInstallerMatchesPip installs the same wheels with pip and with
// wheel.Installer into two venvs and compares what lands where: root
// purelib and platlib, every .data scheme directory, #!python scripts,
// console-script wrappers, modes and RECORD.
func TestInstallerMatchesPip(t *testing.T) {
	t.Parallel()
	py := regtest.SystemPython(t)
	house := t.TempDir()
	pure := buildWheel(t, house, "gp_layout-1.0-py3-none-any.whl", "gp_layout-1.0.dist-info", map[string]string{
		"gp_layout-1.0.dist-info/WHEEL":            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		"gp_layout-1.0.dist-info/METADATA":         "Metadata-Version: 2.1\nName: gp-layout\nVersion: 1.0\n",
		"gp_layout-1.0.dist-info/entry_points.txt": "[console_scripts]\ngp-layout = gp_layout.cli:main\n[gui_scripts]\ngp-layout-gui = gp_layout.cli:main.run\n",
		"gp_layout/__init__.py":                    "X = 1\n",
		"gp_layout/cli.py":                         "def main():\n    return 0\n",
		"gp_layout/tool.sh":                        "#!/bin/sh\n",
		"gp_layout.pth":                            "import sys\n",
		"gp_layout-1.0.data/scripts/gp-layout-run": "#!python\nprint('run')\n",
		"gp_layout-1.0.data/scripts/plain.sh":      "#!/bin/sh\necho plain\n",
		"gp_layout-1.0.data/data/share/gp/a.txt":   "data\n",
		"gp_layout-1.0.data/headers/gp.h":          "int gp;\n",
		"gp_layout-1.0.data/platlib/gp_plat.py":    "P = 1\n",
	}, map[string]bool{"gp_layout/tool.sh": true})
	plat := buildWheel(t, house, "gp_native-2.0-cp311-cp311-linux_x86_64.whl", "gp_native-2.0.dist-info", map[string]string{
		"gp_native-2.0.dist-info/WHEEL":             "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
		"gp_native-2.0.dist-info/METADATA":          "Metadata-Version: 2.1\nName: gp-native\nVersion: 2.0\n",
		"gp_native/__init__.py":                     "N = 2\n",
		"gp_native-2.0.data/purelib/gp_native_p.py": "Q = 1\n",
	}, nil)

	mkvenv := func() string {
		v := filepath.Join(t.TempDir(), "venv")
		if out, err := exec.Command(py, "-I", "-m", "venv", "--without-pip", "--system-site-packages", v).CombinedOutput(); err != nil {
			t.Fatalf("venv: %v\n%s", err, out)
		}
		return v
	}
	byPip, byUs := mkvenv(), mkvenv()
	cmd := exec.Command(filepath.Join(byPip, "bin", "python"), "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "--disable-pip-version-check", "-q", pure, plat)
	cmd.Env = append(os.Environ(), "PIP_NO_CACHE_DIR=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip install: %v\n%s", err, out)
	}
	lay, err := probe.ReadLayout(t.Context(), filepath.Join(byUs, "bin", "python"), nil)
	if err != nil {
		t.Fatal(err)
	}
	mm := strings.Join(strings.SplitN(lay.Version, ".", 3)[:2], ".")
	in := &wheel.Installer{Scheme: wheel.Scheme{
		Purelib: lay.Paths["purelib"], Platlib: lay.Paths["platlib"], Scripts: lay.Paths["scripts"], Data: lay.Paths["data"],
		Headers: filepath.Join(byUs, "include", "site", "python"+mm), Python: filepath.Join(byUs, "bin", "python"),
	}}
	var hooks []string
	for _, p := range []string{pure, plat} {
		f, err := wheel.ParseFilename(filepath.Base(p))
		if err != nil {
			t.Fatal(err)
		}
		got, err := in.Install(p, f)
		if err != nil {
			t.Fatal(err)
		}
		hooks = append(hooks, got.StartupHooks...)
	}
	if diff := cmp.Diff(tree(t, byPip), tree(t, byUs)); diff != "" {
		t.Errorf("installed files (-pip +gpupass):\n%s", diff)
	}
	if want := []string{filepath.Join(lay.Paths["purelib"], "gp_layout.pth")}; !cmp.Equal(hooks, want) {
		t.Errorf("startup hooks %q, want %q", hooks, want)
	}
	// What the environment already has is never overwritten.
	clash := buildWheel(t, house, "gp_clash-1.0-py3-none-any.whl", "gp_clash-1.0.dist-info", map[string]string{
		"gp_clash-1.0.dist-info/WHEEL":      "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n",
		"gp_clash-1.0.dist-info/METADATA":   "Name: gp-clash\nVersion: 1.0\n",
		"gp_clash-1.0.data/scripts/python3": "#!/bin/sh\n",
	}, nil)
	f, _ := wheel.ParseFilename(filepath.Base(clash))
	if _, err := in.Install(clash, f); err == nil || !strings.Contains(err.Error(), "bin/python3 is already in the environment and not from this bundle") {
		t.Errorf("a wheel replacing bin/python3: %v, want a refusal", err)
	}
}

// TestInstallerRefuses: a wheel whose file does not match its RECORD, or
// whose entry points or .data dirs would write outside their place or
// put code into a wrapper, installs nothing further.
func TestInstallerRefuses(t *testing.T) {
	t.Parallel()
	base := map[string]string{
		"gp_bad-1.0.dist-info/WHEEL":    "Wheel-Version: 1.0\nRoot-Is-Purelib: true\n",
		"gp_bad-1.0.dist-info/METADATA": "Name: gp-bad\nVersion: 1.0\n",
		"gp_bad/__init__.py":            "",
	}
	for _, tc := range []struct {
		name  string
		extra map[string]string
		// recordAs is what RECORD hashes instead of the file's content.
		recordAs map[string]string
		want     string
	}{
		{"entry point with a path", map[string]string{"gp_bad-1.0.dist-info/entry_points.txt": "[console_scripts]\n../../evil = gp_bad:main\n"}, nil, "want a plain script name"},
		{"entry point with code", map[string]string{"gp_bad-1.0.dist-info/entry_points.txt": "[console_scripts]\nx = os:system('id')\n"}, nil, "want a plain script name"},
		{"unknown .data dir", map[string]string{"gp_bad-1.0.data/etc/passwd": "x"}, nil, `unknown scheme directory "etc"`},
		{"Wheel-Version 2", map[string]string{"gp_bad-1.0.dist-info/WHEEL": "Wheel-Version: 2.0\nRoot-Is-Purelib: true\n"}, nil, "only 1.x installs"},
		{"content not as RECORD says", map[string]string{"gp_bad/x.py": "AAAA"}, map[string]string{"gp_bad/x.py": "BBBB"}, "RECORD says sha256="},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			files := map[string]string{}
			for k, v := range base {
				files[k] = v
			}
			for k, v := range tc.extra {
				files[k] = v
			}
			dir := t.TempDir()
			p := buildWheel(t, dir, "gp_bad-1.0-py3-none-any.whl", "gp_bad-1.0.dist-info", files, nil, tc.recordAs)
			venv := t.TempDir()
			in := &wheel.Installer{Scheme: wheel.Scheme{Purelib: filepath.Join(venv, "lib"), Platlib: filepath.Join(venv, "lib"), Scripts: filepath.Join(venv, "bin"), Data: venv, Headers: filepath.Join(venv, "include"), Python: "/venv/bin/python"}}
			f, _ := wheel.ParseFilename(filepath.Base(p))
			_, err := in.Install(p, f)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Install = %v, want an error saying %q", err, tc.want)
			}
		})
	}
}
