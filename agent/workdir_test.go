package agent

import (
	"archive/tar"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/workdir"
)

func TestUnpackWorkdir(t *testing.T) {
	t.Parallel()
	plainTar := func(entries ...tar.Header) []byte {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for _, h := range entries {
			h := h
			if err := tw.WriteHeader(&h); err != nil {
				t.Fatal(err)
			}
			if h.Typeflag == tar.TypeReg {
				tw.Write(bytes.Repeat([]byte("x"), int(h.Size)))
			}
		}
		tw.Close()
		return b.Bytes()
	}
	bomb := map[string]string{}
	for i := range 300_000 {
		bomb[fmt.Sprintf("f%06d", i)] = ""
	}
	tests := []struct {
		name    string
		archive []byte
		wantErr string
		want    []string
	}{
		{name: "gzip tar with a sub dir", archive: tarball(t, map[string]string{"train.py": "print(1)", "data/x.csv": "1,2"}), want: []string{"train.py", "data/x.csv"}},
		{name: "plain tar", archive: plainTar(tar.Header{Name: "a.txt", Size: 3, Mode: 0o644, Typeflag: tar.TypeReg}), want: []string{"a.txt"}},
		{name: "absolute path refused", archive: plainTar(tar.Header{Name: "/etc/x", Size: 1, Mode: 0o644, Typeflag: tar.TypeReg}), wantErr: "leaves the work dir"},
		{name: "dot-dot refused", archive: tarball(t, map[string]string{"a/../../x": "1"}), wantErr: "leaves the work dir"},
		{name: "symlink skipped", archive: plainTar(tar.Header{Name: "link", Linkname: "/etc/passwd", Typeflag: tar.TypeSymlink})},
		// Issue #16, finding 7: the broker refuses these at submit; the
		// agent refuses them too, before it has made 300,000 inodes.
		{name: "inode bomb refused", archive: tarball(t, bomb), wantErr: "more than 50000 entries"},
		{name: "deep path refused", archive: tarball(t, map[string]string{strings.Repeat("d/", 40) + "x": "1"}), wantErr: "more than 32 directories deep"},
		{name: "garbage", archive: []byte{0x1f, 0x8b, 1, 2, 3}, wantErr: "unpacking the run's workdir archive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			err := unpackWorkdir(tc.archive, dir, workdir.Limits{})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for _, f := range tc.want {
				if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
					t.Errorf("%s not unpacked: %v", f, err)
				}
			}
			if _, err := os.Lstat(filepath.Join(dir, "link")); err == nil {
				t.Error("a symlink was created")
			}
		})
	}
}

// TestUnpackWorkdirUsesTheAgentsLimits: --workdir-max-* reach the unpack
// (an operator who lowers them, or raises them to match the broker's, is
// heeded), and zero fields fall back to the defaults.
func TestUnpackWorkdirUsesTheAgentsLimits(t *testing.T) {
	t.Parallel()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	for i := range 3 {
		if err := tw.WriteHeader(&tar.Header{Name: fmt.Sprintf("f%d", i), Typeflag: tar.TypeReg, Mode: 0o644}); err != nil {
			t.Fatal(err)
		}
	}
	tw.Close()
	if err := unpackWorkdir(b.Bytes(), t.TempDir(), workdir.Limits{MaxEntries: 2}); err == nil || !strings.Contains(err.Error(), "2") {
		t.Errorf("3 entries under --workdir-max-entries 2: %v, want refused naming the limit", err)
	}
	if err := unpackWorkdir(b.Bytes(), t.TempDir(), workdir.Limits{MaxEntries: 3}); err != nil {
		t.Errorf("3 entries under --workdir-max-entries 3: %v", err)
	}
}
