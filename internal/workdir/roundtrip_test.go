package workdir_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/rand"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/workdir"
)

const bigArchive = 64 << 20

// tree lists every file and directory under dir with its mode and, for
// files, content: what a run on the node sees.
func tree(t *testing.T, dir string) map[string]string {
	t.Helper()
	got := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		v := info.Mode().String()
		if info.Mode().IsRegular() {
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			v += " " + string(b)
		}
		got[filepath.ToSlash(rel)] = v
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return got
}

func write(t *testing.T, dir string, files map[string]os.FileMode) {
	t.Helper()
	for name, mode := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(name), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil { // past the umask
			t.Fatal(err)
		}
	}
}

// A packed work dir unpacks to the same tree: contents, sub directories,
// an executable's x bit and a private file's mode; .git and __pycache__
// stay behind; group and other write are dropped (the node's run user
// owns what it unpacks, nobody else writes to it), and a read-only file
// comes back writable by its owner.
func TestPackUnpackRoundTrip(t *testing.T) {
	t.Parallel()
	src := t.TempDir()
	write(t, src, map[string]os.FileMode{
		"train.py":                 0o644,
		"run.sh":                   0o755,
		"secret.cfg":               0o600,
		"data/x.csv":               0o444,
		"data/deep/er/y.txt":       0o664,
		".git/HEAD":                0o644,
		"pkg/__pycache__/m.pyc":    0o644,
		"pkg/__init__.py":          0o644,
		"empty-dir/.keep-no-files": 0o644,
	})
	if err := os.Remove(filepath.Join(src, "empty-dir", ".keep-no-files")); err != nil {
		t.Fatal(err)
	}
	packed, err := workdir.Pack(src, workdir.PackOptions{MaxCompressed: bigArchive})
	if err != nil {
		t.Fatal(err)
	}
	dst := t.TempDir()
	if err := workdir.Unpack(packed.Archive, dst, workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"train.py":           "-rw-r--r-- train.py",
		"run.sh":             "-rwxr-xr-x run.sh",
		"secret.cfg":         "-rw------- secret.cfg",
		"data":               "drwxr-xr-x",
		"data/x.csv":         "-rw-r--r-- data/x.csv",
		"data/deep":          "drwxr-xr-x",
		"data/deep/er":       "drwxr-xr-x",
		"data/deep/er/y.txt": "-rw-r--r-- data/deep/er/y.txt",
		"pkg":                "drwxr-xr-x",
		"pkg/__init__.py":    "-rw-r--r-- pkg/__init__.py",
		"empty-dir":          "drwxr-xr-x",
	}
	if diff := cmp.Diff(want, tree(t, dst)); diff != "" {
		t.Errorf("unpacked tree (-want +got):\n%s", diff)
	}
}

// Packing refuses what it cannot ship faithfully or what the broker would
// refuse, with the library's typed errors (the command layer adds the
// flag).
func TestPackRefuses(t *testing.T) {
	t.Parallel()
	noise := make([]byte, 2<<20) // incompressible
	if _, err := rand.Read(noise); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string)
		lim   workdir.Limits
		max   int
		check func(error) bool
	}{
		{"a symlink", func(t *testing.T, dir string) {
			if err := os.Symlink("/etc/passwd", filepath.Join(dir, "link")); err != nil {
				t.Fatal(err)
			}
		}, workdir.Limits{}, bigArchive, func(err error) bool {
			return err != nil && strings.Contains(err.Error(), "only regular files and directories")
		}},
		{"more bytes than MaxBytes", func(t *testing.T, dir string) {
			write(t, dir, map[string]os.FileMode{"a": 0o644, "b": 0o644})
		}, workdir.Limits{MaxBytes: 1}, bigArchive, func(err error) bool {
			var le *workdir.LimitError
			return errors.As(err, &le) && le.Limit == "bytes" && le.Max == 1
		}},
		{"more entries than MaxEntries", func(t *testing.T, dir string) {
			write(t, dir, map[string]os.FileMode{"a": 0o644, "b": 0o644, "c": 0o644})
		}, workdir.Limits{MaxEntries: 2}, bigArchive, func(err error) bool {
			var le *workdir.LimitError
			return errors.As(err, &le) && le.Limit == "entries"
		}},
		{"a compressed archive over the size cap", func(t *testing.T, dir string) {
			if err := os.WriteFile(filepath.Join(dir, "noise"), noise, 0o644); err != nil {
				t.Fatal(err)
			}
		}, workdir.Limits{}, 1 << 20, func(err error) bool {
			var tl *workdir.TooLargeError
			return errors.As(err, &tl) && tl.MaxBytes == 1<<20
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			tc.setup(t, dir)
			_, err := workdir.Pack(dir, workdir.PackOptions{Limits: tc.lim, MaxCompressed: tc.max})
			if !tc.check(err) {
				t.Errorf("Pack: %v, not the refusal expected", err)
			}
			if err != nil && !strings.Contains(err.Error(), dir) {
				t.Errorf("Pack: %v, want it to name %s", err, dir)
			}
		})
	}
}

// Unpack writes no link and no entry outside its dir, and holds an
// archive to the same limits as Pack: what packs under a limit unpacks
// under it, one byte more does not.
func TestUnpackEdges(t *testing.T) {
	t.Parallel()
	gz := func(hs ...tar.Header) []byte {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		tw := tar.NewWriter(zw)
		for _, h := range hs {
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		zw.Close()
		return b.Bytes()
	}
	dst := t.TempDir()
	links := gz(tar.Header{Name: "ok", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644},
		tar.Header{Name: "sym", Typeflag: tar.TypeSymlink, Linkname: "/etc/passwd"},
		tar.Header{Name: "hard", Typeflag: tar.TypeLink, Linkname: "ok"})
	if err := workdir.Unpack(links, dst, workdir.Limits{}); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"ok": "-rw-r--r-- x"}, tree(t, dst)); diff != "" {
		t.Errorf("links were not skipped (-want +got):\n%s", diff)
	}
	if err := workdir.Unpack(gz(tar.Header{Name: "../escape", Typeflag: tar.TypeReg, Size: 1, Mode: 0o644}), t.TempDir(), workdir.Limits{}); err == nil || !strings.Contains(err.Error(), "leaves the work dir") {
		t.Errorf("../escape: %v, want refused", err)
	}

	src := t.TempDir()
	write(t, src, map[string]os.FileMode{"abc": 0o644, "de": 0o644}) // 5 bytes
	packed, err := workdir.Pack(src, workdir.PackOptions{Limits: workdir.Limits{MaxBytes: 5}, MaxCompressed: bigArchive})
	if err != nil {
		t.Fatal(err)
	}
	archive := packed.Archive
	if err := workdir.Unpack(archive, t.TempDir(), workdir.Limits{MaxBytes: 5}); err != nil {
		t.Errorf("unpacking under the limit it was packed under: %v", err)
	}
	var le *workdir.LimitError
	if err := workdir.Unpack(archive, t.TempDir(), workdir.Limits{MaxBytes: 4}); !errors.As(err, &le) || le.Limit != "bytes" {
		t.Errorf("unpacking 5 bytes under a 4-byte limit: %v, want a bytes LimitError", err)
	}
}
