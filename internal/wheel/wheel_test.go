package wheel_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/wheel"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

func TestParseFilename(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file    string
		name    string
		version string
		build   string
		tags    []string
		wantErr string
	}{
		{file: "flash_attn-2.5.5-cp310-cp310-linux_x86_64.whl", name: "flash-attn", version: "2.5.5", tags: []string{"cp310-cp310-linux_x86_64"}},
		{file: "six-1.16.0-py2.py3-none-any.whl", name: "six", version: "1.16.0", tags: []string{"py2-none-any", "py3-none-any"}},
		{file: "torch-2.1.0+cu121-1-cp310-cp310-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", name: "torch", version: "2.1.0+cu121", build: "1",
			tags: []string{"cp310-cp310-manylinux2014_x86_64", "cp310-cp310-manylinux_2_17_x86_64"}},
		{file: "Foo.Bar-1.0-py3-none-any.whl", name: "foo-bar", version: "1.0", tags: []string{"py3-none-any"}},
		{file: "../evil-1.0-py3-none-any.whl", wantErr: "path separators"},
		{file: "a/b-1.0-py3-none-any.whl", wantErr: "path separators"},
		{file: `a\b-1.0-py3-none-any.whl`, wantErr: "path separators"},
		{file: "notes.txt", wantErr: "does not end in .whl"},
		{file: "foo-1.0.whl", wantErr: "dash-separated parts"},
		{file: "foo-1.0-x-py3-none-any.whl", wantErr: "invalid build tag"},
		{file: "foo-1.0-py3-none-..any.whl", wantErr: "invalid tag"},
		{file: "fo$o-1.0-py3-none-any.whl", wantErr: "invalid distribution name"},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			f, err := wheel.ParseFilename(tt.file)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ParseFilename(%q) error = %v, want it to contain %q", tt.file, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var tags []string
			for _, tg := range f.Tags {
				tags = append(tags, tg.String())
			}
			got := []string{f.Name(), f.Version, f.Build}
			want := []string{tt.name, tt.version, tt.build}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("name/version/build (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.tags, tags); diff != "" {
				t.Errorf("tags (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSupportedTags(t *testing.T) {
	t.Parallel()
	set, err := wheel.SupportedTags(wheel.DefaultTarget("3.10.12"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		tag  string
		want bool
	}{
		{"cp310-cp310-manylinux_2_17_x86_64", true},
		{"cp310-cp310-manylinux2014_x86_64", true},
		{"cp310-cp310-manylinux1_x86_64", true},
		{"cp310-cp310-manylinux_2_35_x86_64", true},
		{"cp310-cp310-manylinux_2_36_x86_64", false}, // needs a newer glibc than the node's
		{"cp310-cp310-linux_x86_64", true},
		{"cp311-cp311-manylinux_2_17_x86_64", false}, // another interpreter
		{"cp39-cp39-manylinux_2_17_x86_64", false},
		{"cp38-abi3-manylinux_2_17_x86_64", true},
		{"cp311-abi3-manylinux_2_17_x86_64", false},
		{"cp310-cp310-manylinux_2_17_aarch64", false},
		{"cp310-cp310-macosx_11_0_arm64", false},
		{"cp310-cp310-win_amd64", false},
		{"py3-none-any", true},
		{"py2-none-any", false},
		{"py310-none-any", true},
		{"cp310-none-any", true},
		{"py3-none-manylinux_2_28_x86_64", true},
	}
	for _, tt := range tests {
		p := strings.Split(tt.tag, "-")
		if got := set.Compatible([]wheel.Tag{{Python: p[0], ABI: p[1], Platform: p[2]}}); got != tt.want {
			t.Errorf("python 3.10 on glibc 2.35 x86_64 accepts %s = %v, want %v", tt.tag, got, tt.want)
		}
	}
	for _, bad := range []wheel.Target{
		{Python: "3", OS: "linux", Arch: "x86_64", GLIBC: "2.35"},
		{Python: "2.7", OS: "linux", Arch: "x86_64", GLIBC: "2.35"},
		{Python: "3.10", OS: "darwin", Arch: "arm64", GLIBC: "2.35"},
		{Python: "3.10", OS: "linux", Arch: "sparc", GLIBC: "2.35"},
		{Python: "3.10", OS: "linux", Arch: "x86_64", GLIBC: "musl"},
	} {
		if _, err := wheel.SupportedTags(bad); err == nil {
			t.Errorf("SupportedTags(%+v) succeeded, want an error", bad)
		}
	}
}

func TestInspect(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	mod := []wheeltest.File{{Name: "demo/__init__.py", Data: strings.NewReader("x = 1\n")}}
	write := func(file string, o wheeltest.Options) string {
		t.Helper()
		p, err := wheeltest.Write(dir, file, "demo", "1.0", mod, o)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("demo-1.0-py3-none-any.whl", wheeltest.Options{})
	lie := write("demo-1.0-1-py3-none-any.whl", wheeltest.Options{LieAbout: "demo/__init__.py"})
	unlisted := write("demo-1.0-2-py3-none-any.whl", wheeltest.Options{Unlisted: "demo/__init__.py"})
	wrongDist := filepath.Join(dir, "other-1.0-py3-none-any.whl")
	if err := os.Link(good, wrongDist); err != nil {
		t.Fatal(err)
	}
	corrupt := filepath.Join(dir, "demo-1.0-3-py3-none-any.whl")
	b, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(corrupt, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		path    string
		wantErr string
	}{
		{good, ""},
		{lie, "RECORD says sha256="},
		{unlisted, "not listed in RECORD"},
		{wrongDist, "no other-1.0.dist-info/RECORD"},
		{corrupt, "not a readable zip"},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.path), func(t *testing.T) {
			t.Parallel()
			f, err := wheel.ParseFilename(filepath.Base(tt.path))
			if err != nil {
				t.Fatal(err)
			}
			for _, check := range []struct {
				name string
				fn   func(string, wheel.Filename) error
			}{{"Inspect", wheel.Inspect}, {"VerifyStream", verifyStream}} {
				err := check.fn(tt.path, f)
				if tt.wantErr == "" {
					if err != nil {
						t.Errorf("%s: %v", check.name, err)
					}
					continue
				}
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), filepath.Base(tt.path)) {
					t.Errorf("%s error = %v, want it to name the wheel and contain %q", check.name, err, tt.wantErr)
				}
			}
		})
	}
}

// verifyStream checks a wheel file the way a download does: one pass,
// then the central directory.
func verifyStream(p string, f wheel.Filename) error {
	fh, err := os.Open(p)
	if err != nil {
		return err
	}
	defer fh.Close()
	s, err := wheel.VerifyStream(fh, f)
	if err != nil {
		return err
	}
	st, err := fh.Stat()
	if err != nil {
		return err
	}
	return s.Check(fh, st.Size())
}

// A zip whose central directory points at other bytes than the local
// entries (the classic way to show a scanner one file and pip another)
// fails the stream check.
func TestVerifyStreamDirectoryMismatch(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p, err := wheeltest.Write(dir, "demo-1.0-py3-none-any.whl", "demo", "1.0",
		[]wheeltest.File{{Name: "demo/__init__.py", Data: strings.NewReader("x = 1\n")}}, wheeltest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	// Flip one byte of the first central directory entry's CRC.
	i := bytes.Index(b, []byte("PK\x01\x02"))
	if i < 0 {
		t.Fatal("no central directory")
	}
	b[i+16] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
	f, _ := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	if err := verifyStream(p, f); err == nil || !strings.Contains(err.Error(), "disagree") {
		t.Fatalf("verifyStream = %v, want a central directory mismatch", err)
	}
}
