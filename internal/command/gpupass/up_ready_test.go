package gpupass

import (
	"os"
	"path/filepath"
	"testing"
)

// up's ready line names a spec and a script that are there where up runs
// (issue #32, item 1): the project's own after `gpupass init`, the
// repository's example at its root, else `gpupass init` first. The
// end-to-end test pastes the first kind; these are the others.
func TestUpReadyCommandNamesFilesThatExist(t *testing.T) {
	t.Parallel()
	mk := func(files ...string) string {
		dir := t.TempDir()
		for _, f := range files {
			p := filepath.Join(dir, filepath.FromSlash(f))
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		return dir
	}
	home := filepath.Dir(t.TempDir())
	o := &UpOptions{Regions: []string{"us-west-2", "eu central"}, Python: "/usr/bin/python3", Getenv: func(k string) string {
		if k == "HOME" {
			return home // the search for a .gpupass stops here, above no test's dir
		}
		return ""
	}}
	proj := mk("gpupass.yaml", "train.py", ".gpupass/config.json", "src/deep/x.py")
	elsewhere := filepath.Join(t.TempDir(), "state")
	tests := []struct{ name, dir, stateDir, want string }{
		{"a project from init", mk("gpupass.yaml", "train.py", "examples/train/gpupass.yaml", "examples/train/train.py"), "",
			"gpupass train --spec gpupass.yaml --region us-west-2 --region 'eu central' --follow -- /usr/bin/python3 train.py"},
		{"the repository root", mk("examples/train/gpupass.yaml", "examples/train/train.py"), "",
			"gpupass train --spec examples/train/gpupass.yaml --region us-west-2 --region 'eu central' --follow -- /usr/bin/python3 train.py"},
		{"a spec without train.py", mk("gpupass.yaml"), "",
			"gpupass init && gpupass train --spec gpupass.yaml --region us-west-2 --region 'eu central' --follow -- /usr/bin/python3 train.py"},
		{"an empty directory", mk(), "",
			"gpupass init && gpupass train --spec gpupass.yaml --region us-west-2 --region 'eu central' --follow -- /usr/bin/python3 train.py"},
		// up run below the project's root finds its .gpupass: the
		// project's spec, not init in the subdirectory.
		{"a subdirectory of the project", filepath.Join(proj, "src", "deep"), filepath.Join(proj, ".gpupass"),
			"gpupass train --spec ../../gpupass.yaml --region us-west-2 --region 'eu central' --follow -- /usr/bin/python3 train.py"},
		// --state-dir elsewhere: commands here would find the project's
		// .gpupass (another stack's token), so the line names this one.
		{"--state-dir elsewhere", proj, elsewhere,
			"GPUPASS_STATE_DIR=" + elsewhere + " gpupass train --spec gpupass.yaml --region us-west-2 --region 'eu central' --follow -- /usr/bin/python3 train.py"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			stateDir := tc.stateDir
			if stateDir == "" {
				stateDir = filepath.Join(tc.dir, ".gpupass")
			}
			if got := readyCommand(o, tc.dir, stateDir, false); got != tc.want {
				t.Errorf("ready: %s\nwant:   %s", got, tc.want)
			}
		})
	}
	// A broker off loopback: the consent comes before --, among train's
	// own flags (TestE2EUpOffLoopbackPrintsCommandsThatWork pastes it).
	want := "gpupass init && gpupass train --spec gpupass.yaml --region us-west-2 --region 'eu central' --insecure-http --follow -- /usr/bin/python3 train.py"
	dir := mk()
	if got := readyCommand(o, dir, filepath.Join(dir, ".gpupass"), true); got != want {
		t.Errorf("ready off loopback: %s\nwant:   %s", got, want)
	}
}
