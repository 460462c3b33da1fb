package gpupass_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// train's work dir flags as a user types them (issue #32, item 1): the
// spec's directory ships by default, --workdir picks another,
// --no-workdir ships none, and conflicting flags are refused naming both.
// --list-workdir shows it all without a broker.
func TestTrainWorkdirFlags(t *testing.T) {
	t.Parallel()
	proj, other, bare := t.TempDir(), t.TempDir(), t.TempDir()
	for dir, files := range map[string]map[string]string{
		proj:  {"gpupass.yaml": "name: x\n", "train.py": "print(1)\n", "cosign.key": "k", ".gpupassignore": "/cosign.key\n"},
		other: {"other.py": "print(2)\n"},
		bare:  {"gpupass.yaml": "name: x\n", "cosign.key": "k"},
	} {
		for name, body := range files {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	spec := filepath.Join(proj, "gpupass.yaml")
	tests := []struct {
		name    string
		args    []string
		code    int
		want    []string
		notWant []string
	}{
		{"the spec's directory by default", []string{"--spec", spec}, 0,
			[]string{"work dir " + proj + " would ship: 3 files", "ship  train.py", "ship  gpupass.yaml", "skip  cosign.key  (.gpupassignore:1 /cosign.key)"}, []string{"other.py"}},
		{"--workdir picks another", []string{"--spec", spec, "--workdir", other}, 0, []string{"ship  other.py"}, []string{"train.py"}},
		{"--no-workdir ships none", []string{"--spec", spec, "--no-workdir"}, 0, []string{"no work dir is shipped"}, []string{"train.py"}},
		{"--workdir and --no-workdir", []string{"--spec", spec, "--workdir", other, "--no-workdir"}, 2,
			[]string{`--workdir "` + other + `" and --no-workdir exclude each other`}, nil},
		{"--include and --no-workdir", []string{"--spec", spec, "--include", "cosign.key", "--no-workdir"}, 2,
			[]string{`--include "cosign.key" and --no-workdir exclude each other`}, nil},
		{"--include of a file that is not refused", []string{"--spec", spec, "--include", "cosign.key"}, 2,
			[]string{`--include "cosign.key": not a file of ` + proj + ` that looks like a secret`}, nil},
		{"a secret not left out", []string{"--spec", spec, "--workdir", proj, "--include", "nothing.key"}, 2,
			[]string{`--include "nothing.key"`}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runMain(t, append([]string{"train", "--list-workdir"}, tc.args...)...)
			all := out + errOut
			if code != tc.code {
				t.Errorf("exit %d, want %d:\n%s", code, tc.code, all)
			}
			for _, w := range tc.want {
				if !strings.Contains(all, w) {
					t.Errorf("output lacks %q:\n%s", w, all)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(all, w) {
					t.Errorf("output has %q:\n%s", w, all)
				}
			}
		})
	}

	// Without .gpupassignore the key is refused, with both fixes printed.
	code, out, errOut := runMain(t, "train", "--list-workdir", "--spec", filepath.Join(bare, "gpupass.yaml"))
	for _, w := range []string{"cosign.key (a key file (*.key))", "printf '\\n%s\\n' /cosign.key >> " + filepath.Join(bare, ".gpupassignore"), "add --include cosign.key to the command"} {
		if code != 2 || !strings.Contains(out+errOut, w) {
			t.Errorf("exit %d, output lacks %q:\n%s", code, w, out+errOut)
		}
	}
}

// The refusal's --include fix, pasted, ships the key.
func TestTrainIncludeShipsARefusedFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	for name, body := range map[string]string{"gpupass.yaml": "name: x\n", "cosign.key": "k", ".env": "A=1\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	code, out, errOut := runMain(t, "train", "--list-workdir", "--spec", filepath.Join(dir, "gpupass.yaml"), "--include", "cosign.key,.env")
	if code != 0 || !strings.Contains(out, "ship  cosign.key") || !strings.Contains(out, "ship  .env") {
		t.Errorf("exit %d, want cosign.key and .env shipped:\n%s%s", code, out, errOut)
	}
}
