package localstack

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/gpupass/gpupass/internal/app/validate"
)

// Issue #32 item 3: the project's .gpupass is found from its
// subdirectories, but not past a git root or $HOME.
func TestFindStateDir(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	mk := func(p string) string {
		d := filepath.Join(root, p)
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	mk("home/proj/.gpupass")
	mk("home/proj/src/deep")
	mk("home/proj/repo/.git")
	mk("home/proj/repo/sub")
	mk("home/.gpupass")
	mk("home/bare/sub")
	mk(".gpupass") // above $HOME: no user's project
	mk("elsewhere/x")
	home := filepath.Join(root, "home")
	tests := []struct {
		name, cwd, want string
	}{
		{"in the project dir", "home/proj", StateDirName},
		{"from a subdirectory", "home/proj/src/deep", filepath.Join(root, "home/proj/.gpupass")},
		{"stops at a git root", "home/proj/repo/sub", ""},
		{"$HOME's own counts", "home/bare/sub", filepath.Join(home, ".gpupass")},
		{"never above $HOME", "home/bare/sub", ""},
		{"outside $HOME up to /", "elsewhere/x", filepath.Join(root, ".gpupass")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := home
			if tc.name == "never above $HOME" {
				h = filepath.Join(home, "bare")
			}
			if got := FindStateDir(filepath.Join(root, tc.cwd), h); got != tc.want {
				t.Errorf("FindStateDir(%s) = %q, want %q", tc.cwd, got, tc.want)
			}
		})
	}
}

func TestStateDirFrom(t *testing.T) {
	t.Parallel()
	proj := t.TempDir()
	sub := filepath.Join(proj, "a")
	if err := os.MkdirAll(filepath.Join(proj, ".gpupass"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	empty := t.TempDir()
	if err := os.Mkdir(filepath.Join(empty, ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		env  map[string]string
		cwd  string
		want string
	}{
		{"nothing found: in the working directory", nil, empty, ".gpupass"},
		{"the project's, from a subdirectory", nil, sub, filepath.Join(proj, ".gpupass")},
		{"XDG state home before the project's", map[string]string{"XDG_STATE_HOME": "/x/state"}, sub, "/x/state/gpupass"},
		{"explicit dir wins", map[string]string{"XDG_STATE_HOME": "/x/state", "GPUPASS_STATE_DIR": "/y"}, sub, "/y"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := StateDirFrom(func(k string) string { return tc.env[k] }, tc.cwd); got != tc.want {
				t.Errorf("StateDirFrom = %q, want %q", got, tc.want)
			}
		})
	}
}

// A project with a spec and no stack yet: up from a subdirectory keeps
// its state beside the spec, not in the subdirectory; a .gpupass found
// first wins, and the search stops at a git work tree's root.
func TestProjectStateDir(t *testing.T) {
	if !slices.Equal(ProjectSpecNames, validate.SpecFileNames) {
		t.Fatalf("ProjectSpecNames %v, validate.SpecFileNames %v: a project's root is where validate finds its spec", ProjectSpecNames, validate.SpecFileNames)
	}
	home := t.TempDir()
	proj := filepath.Join(home, "proj")
	sub := filepath.Join(proj, "src", "deep")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	env := func(string) string { return "" }
	if got := StateDirFrom(env, sub); got != StateDirName {
		t.Errorf("no spec anywhere: %q, want %q", got, StateDirName)
	}
	if err := os.WriteFile(filepath.Join(proj, "gpupass.yaml"), []byte("name: x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for dir, want := range map[string]string{sub: filepath.Join(proj, StateDirName), proj: StateDirName} {
		if got := StateDirFrom(env, dir); got != want {
			t.Errorf("from %s: %q, want %q", dir, got, want)
		}
	}
	if err := os.Mkdir(filepath.Join(proj, "src", ".git"), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := ProjectStateDir(sub, home); got != "" {
		t.Errorf("across a git root: %q, want none", got)
	}
	if err := os.Mkdir(filepath.Join(sub, StateDirName), 0o755); err != nil {
		t.Fatal(err)
	}
	if got := StateDirFrom(env, sub); got != StateDirName {
		t.Errorf("with a .gpupass in the subdirectory: %q, want it", got)
	}
}
