package agent

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

// writeWheel writes a wheel (PEP 427) of name version holding files
// (archive path -> content), with its WHEEL, METADATA and a RECORD that
// hashes every file, into dir.
func writeWheel(t *testing.T, dir, name, version string, files map[string]string) string {
	t.Helper()
	dist := strings.ReplaceAll(name, "-", "_")
	di := dist + "-" + version + ".dist-info/"
	all := map[string]string{
		di + "WHEEL":    "Wheel-Version: 1.0\nGenerator: gpupass-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
		di + "METADATA": "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + version + "\n",
	}
	for k, v := range files {
		all[k] = v
	}
	names := make([]string, 0, len(all))
	for k := range all {
		names = append(names, k)
	}
	sort.Strings(names)
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, n := range names {
		w, err := zw.Create(n)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(all[n]))
		sum := sha256.Sum256([]byte(all[n]))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", n, base64.RawURLEncoding.EncodeToString(sum[:]), len(all[n]))
	}
	record.WriteString(di + "RECORD,,\n")
	w, err := zw.Create(di + "RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String()))
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, dist+"-"+version+"-py3-none-any.whl")
	if err := os.WriteFile(file, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// markCode is Python that records the uid it runs as (a file
// KIND-UID-PID in marks) and tries to copy the agent's identity key
// there (stolen-UID-PID): what a hostile bundle or work dir would do.
func markCode(marks, key, kind string) string {
	return fmt.Sprintf(`import os as _o, sys as _s
try:
    open(_o.path.join(%[1]q, "%[3]s-%%d-%%d" %% (_o.getuid(), _o.getpid())), "w").write(" ".join(getattr(_s, "argv", []) or ["?"]))
except Exception:
    pass
try:
    _k = open(%[2]q).read()
    open(_o.path.join(%[1]q, "stolen-%%d-%%d" %% (_o.getuid(), _o.getpid())), "w").write(_k)
except Exception:
    pass
`, marks, key, kind)
}

// TestBundleCodeNeverRunsAsTheAgent reproduces issue #16 finding 1: an
// agent running as root with --run-as nobody installs a bundle whose
// wheels carry every hook Python runs at start (a .pth, sitecustomize,
// usercustomize, a console script named like the interpreter), in a work
// dir with torch.py/numpy.py shadows, under an environment with
// PYTHONPATH and PYTHONSTARTUP pointing at more of them. No hook may run
// as uid 0 and the key must stay put; the job's own interpreter (uid
// 65534) runs them, which proves the hooks work. The package check
// passes and fails from the installed metadata, and the job cannot write
// into the venv that was measured. Not parallel: it sets the agent's
// environment.
func TestBundleCodeNeverRunsAsTheAgent(t *testing.T) {
	testutil.NeedRoot(t)
	py := regtest.SystemPython(t)
	host := regtest.StartRegistry(t)
	ctx := t.Context()
	reg := bundle.RegistryOptions{PlainHTTP: true}

	parent := testutil.TempDirMode(t, 0o711)
	marks := filepath.Join(parent, "marks")
	if err := os.Mkdir(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(marks, 0o777); err != nil {
		t.Fatal(err)
	}
	o := &Options{
		StateDir: filepath.Join(parent, "state"), Region: "us-west-2", StorageClass: "standard",
		Simulate: "h100-sxm5-8x", Python: py, SuiteInterval: time.Hour, ReadProbeMB: 1, RunAs: "nobody",
	}
	if err := o.Validate(false); err != nil {
		t.Fatal(err)
	}
	ag, err := New(o, quiet())
	if err != nil {
		t.Fatal(err)
	}
	key := filepath.Join(o.StateDir, KeyFile)
	keyBytes, err := os.ReadFile(key)
	if err != nil {
		t.Fatal(err)
	}

	house := t.TempDir()
	writeWheel(t, house, "gp-evil", "1.0", map[string]string{
		"gp_evil/__init__.py":                    markCode(marks, key, "import") + "def hello():\n    return 'gp-evil 1.0'\n",
		"gp_evil/cli.py":                         markCode(marks, key, "script") + "def main():\n    return 0\n",
		"gp_evil_boot.py":                        markCode(marks, key, "pth"),
		"gp_evil.pth":                            "import gp_evil_boot\n",
		"gp_evil-1.0.dist-info/entry_points.txt": "[console_scripts]\ngp-evil-cli = gp_evil.cli:main\npip = gp_evil.cli:main\npip3 = gp_evil.cli:main\n",
		"gp_evil-1.0.data/scripts/gp-evil-run":   "#!python\nimport gp_evil\n",
	})
	writeWheel(t, house, "gp-site", "2.0", map[string]string{
		"sitecustomize.py": markCode(marks, key, "sitecustomize"),
		"usercustomize.py": markCode(marks, key, "usercustomize"),
	})
	pushed := push(ctx, t, house, host+"/ml/evil:v1", reg)
	// A console script named like the interpreter would replace the
	// venv's python, which the agent used to start.
	house2 := t.TempDir()
	writeWheel(t, house2, "gp-shadow", "1.0", map[string]string{
		"gp_shadow/__init__.py":                    "",
		"gp_shadow-1.0.dist-info/entry_points.txt": "[console_scripts]\npython = gp_shadow:main\n",
	})
	shadow := push(ctx, t, house2, host+"/ml/shadow:v1", reg)

	// The agent's own environment points Python at more hooks; the job
	// inherits it (minus GPUPASS_*).
	envHooks := testutil.TempDirMode(t, 0o755)
	for file, kind := range map[string]string{"torch.py": "pythonpath-torch", "numpy.py": "pythonpath-numpy", "startup.py": "pythonstartup"} {
		if err := os.WriteFile(filepath.Join(envHooks, file), []byte(markCode(marks, key, kind)), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("PYTHONPATH", envHooks)
	t.Setenv("PYTHONSTARTUP", filepath.Join(envHooks, "startup.py"))
	t.Setenv("PYTHONINSPECT", "")

	workdir := map[string]string{
		"torch.py": markCode(marks, key, "workdir-torch"),
		"numpy.py": markCode(marks, key, "workdir-numpy"),
	}
	job := `import os, sys, glob, gp_evil, torch
print("job", gp_evil.hello(), os.getuid())
venv = sys.prefix
print("PREFIX=" + venv)
for target in [os.path.join(os.path.dirname(gp_evil.__file__), "__init__.py"), os.path.join(venv, "lib", "new.pth"), os.path.join(venv, "bin", "python3")]:
    try:
        open(target, "a").write("\nimport os\n")
        print("VENV_" + "WRITABLE", target)
    except OSError as e:
        print("VENV_" + "WRITE_REFUSED", e.errno)
try:
    os.rename(venv, venv + ".moved")
    print("VENV_" + "WRITABLE rename")
except OSError:
    print("VENV_" + "RENAME_REFUSED")
`
	l := &RunLoop{
		Source: nil, AgentID: func() string { return "agent-1" },
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
		StateDir: o.StateDir, Python: py, RunAs: o.runAs,
		UpdateEvery: 50 * time.Millisecond, DrainTimeout: 10 * time.Second,
		Bundles: BundleInstaller{Registry: reg},
	}
	offline := func(ref string, pkgs ...string) spec.Spec {
		return spec.Spec{Name: "offline", Runtime: spec.Runtime{Bundle: ref, Packages: pkgs}, Security: spec.Security{NoInternetAccess: true}}
	}
	tests := []struct {
		name       string
		spec       spec.Spec
		wantState  AllocState
		wantReason string
		wantMsgs   []string
		notMsgs    []string
	}{
		{
			name:      "hooks run only in the job",
			spec:      offline(pushed.Reference, "gp-evil==1.0", "gp_site==2.0", "numpy==1.24.2"),
			wantState: StateSucceeded,
			wantMsgs: []string{
				"installed gp-evil 1.0 from gp_evil-1.0-py3-none-any.whl",
				"installs code that Python runs at every start",
				"gp_evil.pth", "sitecustomize.py", "usercustomize.py",
				"package gp-evil 1.0 (expected 1.0)", "package gp_site 2.0 (expected 2.0)", "package numpy 1.24.2 (expected 1.24.2)",
				"job gp-evil 1.0 65534", "VENV_WRITE_REFUSED 13", "VENV_RENAME_REFUSED",
			},
			notMsgs: []string{"VENV_WRITABLE", "PRIVATE KEY"},
		},
		{
			name:       "the package check still fails from metadata",
			spec:       offline(pushed.Reference, "gp-evil==1.0", "numpy==9.9"),
			wantState:  StateFailed,
			wantReason: "numpy expected 9.9, installed 1.24.2",
			notMsgs:    []string{"job gp-evil"},
		},
		{
			name:       "a pin the bundle has in another version",
			spec:       offline(pushed.Reference, "gp-evil==2.0"),
			wantState:  StateFailed,
			wantReason: "pin gp-evil==2.0",
			notMsgs:    []string{"job gp-evil"},
		},
		{
			name:       "a console script named python is refused",
			spec:       offline(shadow.Reference, "gp-shadow==1.0"),
			wantState:  StateFailed,
			wantReason: "bin/python is already in the environment and not from this bundle",
			notMsgs:    []string{"job gp-evil"},
		},
	}
	for i, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := newMemSource()
			l.Source = src
			l.RunReport = ag.runReporter(src)
			a := &Assignment{AllocID: fmt.Sprintf("alloc-hooks%04d", i), FencingToken: 1, Spec: specJSON(t, tc.spec),
				Command: []string{py, "-c", job}, Workdir: tarball(t, workdir)}
			final := l.RunAssignment(ctx, a)
			msgs := src.messages(t)
			if final.State != tc.wantState || !strings.Contains(final.Reason, tc.wantReason) {
				t.Fatalf("run %s (%s), want %s saying %q; events: %q", final.State, final.Reason, tc.wantState, tc.wantReason, msgs)
			}
			for _, w := range tc.wantMsgs {
				if !contains(msgs, w) {
					t.Errorf("no event says %q; events: %q", w, msgs)
				}
			}
			for _, w := range tc.notMsgs {
				if contains(msgs, w) {
					t.Errorf("an event says %q; events: %q", w, msgs)
				}
			}
			if tc.wantState != StateSucceeded {
				return
			}
			// The venv that was measured is the agent's and the job's
			// user cannot write into it.
			var venv string
			for _, m := range msgs {
				if v, ok := strings.CutPrefix(m, "PREFIX="); ok {
					venv = v
				}
			}
			if venv == "" {
				t.Fatalf("the job did not say its sys.prefix; events: %q", msgs)
			}
			err := filepath.WalkDir(venv, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				fi, err := os.Lstat(p)
				if err != nil {
					return err
				}
				st := fi.Sys().(*syscall.Stat_t)
				if st.Uid != 0 || (fi.Mode()&fs.ModeSymlink == 0 && fi.Mode().Perm()&0o022 != 0) {
					t.Errorf("%s: owner uid %d, mode %s: the job's user could change the measured venv", p, st.Uid, fi.Mode())
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}

	got, err := os.ReadDir(marks)
	if err != nil {
		t.Fatal(err)
	}
	byJob := map[string]bool{}
	for _, e := range got {
		parts := strings.Split(e.Name(), "-")
		uid := parts[len(parts)-2]
		kind := strings.Join(parts[:len(parts)-2], "-")
		b, _ := os.ReadFile(filepath.Join(marks, e.Name()))
		if uid == "0" {
			t.Errorf("%s ran as uid 0 (the agent): %s; argv %q", kind, e.Name(), b)
		}
		if bytes.Contains(b, keyBytes) {
			t.Errorf("%s holds the agent's identity key", e.Name())
		}
		if uid == "65534" {
			byJob[kind] = true
		}
	}
	// The hooks are live: the job's own interpreter ran them. (Debian's
	// own sitecustomize in the stdlib dir shadows the bundle's there.)
	for _, kind := range []string{"pth", "import", "workdir-torch"} {
		if !byJob[kind] {
			t.Errorf("no %s marker from the job's user (65534): the test would not notice the hook; markers: %v", kind, got)
		}
	}
}
