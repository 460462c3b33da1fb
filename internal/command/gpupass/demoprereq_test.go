package gpupass_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/testutil"
)

// debianPython is the interpreter the demo runs with by default; Debian's
// python3-torch and python3-numpy serve it only.
const debianPython = "/usr/bin/python3"

// demoAptLine is the install line `make demo` and `up --demo` print.
const demoAptLine = "apt-get install -y --no-install-recommends python3 python3-torch python3-numpy"

// bareVenv is a real venv of /usr/bin/python3 without the system site
// packages: the interpreter a fresh machine's demo would meet, with no
// torch and no numpy. dists are fake distributions put in its
// site-packages (directory name -> file -> content).
func bareVenv(t *testing.T, dir string, files map[string]string) (python, site string) {
	t.Helper()
	if _, err := os.Stat(debianPython); err != nil {
		testutil.Missing(t, "%s (Debian's python3)", debianPython)
	}
	venv := filepath.Join(dir, "venv")
	if out, err := exec.Command(debianPython, "-I", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("creating a venv: %v\n%s", err, out)
	}
	sites, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages"))
	if err != nil || len(sites) != 1 {
		t.Fatalf("the venv's site-packages: %v %v", sites, err)
	}
	for name, content := range files {
		p := filepath.Join(sites[0], name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(venv, "bin", "python3"), sites[0]
}

// needDebianTorch stops a test that needs /usr/bin/python3 with the
// demo's packages (`make demo` or `make deps` installs them).
func needDebianTorch(t *testing.T) {
	t.Helper()
	if out, err := exec.Command(debianPython, "-I", "-c", "import torch, numpy").CombinedOutput(); err != nil {
		testutil.Missing(t, "%s with torch and numpy: %v %s", debianPython, err, out)
	}
}

// TestCheckDemoPython runs the check `up --demo` makes before it starts
// anything against real interpreters: a bare venv (a fresh machine) must
// be refused naming the interpreter, what it lacks and the fix; one with
// another numpy names both versions; Debian's python3 passes.
func TestCheckDemoPython(t *testing.T) {
	t.Parallel()
	example := filepath.Join(testutil.RepoRoot(t), "examples", "train")
	// torch importable, numpy at another version than the spec pins.
	oldNumpy := map[string]string{
		"torch/__init__.py":              "__version__ = '1.13.0'\n",
		"numpy/__init__.py":              "__version__ = '1.0.0'\n",
		"numpy-1.0.0.dist-info/METADATA": "Metadata-Version: 2.1\nName: numpy\nVersion: 1.0.0\n",
	}
	tests := []struct {
		name   string
		python func(t *testing.T) string
		want   []string // substrings of the error; none: it passes
	}{
		{
			name:   "bare venv lacks torch and numpy",
			python: func(t *testing.T) string { py, _ := bareVenv(t, t.TempDir(), nil); return py },
			want:   []string{"torch (not found", "numpy==1.24.2 (not installed)", "make demo", demoAptLine, "--python"},
		},
		{
			name:   "another numpy",
			python: func(t *testing.T) string { py, _ := bareVenv(t, t.TempDir(), oldNumpy); return py },
			want:   []string{"numpy==1.24.2 (installed 1.0.0)", demoAptLine},
		},
		{
			name:   "no such interpreter",
			python: func(t *testing.T) string { return filepath.Join(t.TempDir(), "python3") },
			want:   []string{"a Python that starts (not found", demoAptLine},
		},
		{
			name:   "Debian python3 with python3-torch and python3-numpy",
			python: func(t *testing.T) string { needDebianTorch(t); return debianPython },
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			py := tt.python(t)
			err := gpupass.CheckDemoPython(context.Background(), py, example)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("CheckDemoPython(%s) = %v, want nil", py, err)
				}
				return
			}
			if err == nil {
				t.Fatalf("CheckDemoPython(%s) = nil, want an error naming %q", py, tt.want)
			}
			for _, w := range append(tt.want, py) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not name %q", err, w)
				}
			}
		})
	}
}

// TestUpDemoChecksPythonFirst runs `gpupass up --demo` with an interpreter
// that lacks the demo's packages: it must fail at once, naming them,
// before a broker or agent starts (the state dir is never created),
// instead of failing the run in both regions.
func TestUpDemoChecksPythonFirst(t *testing.T) {
	t.Parallel()
	py, _ := bareVenv(t, t.TempDir(), nil)
	state := filepath.Join(t.TempDir(), "state")
	var out bytes.Buffer
	err := gpupass.RunUp(context.Background(), &gpupass.UpOptions{
		StateDir: state, Listen: "127.0.0.1:0", Regions: []string{"us-west-2", "eu-central-1"}, AgentsPerRegion: 1,
		Profile: "a100-80gb-4x", Python: py, Demo: true,
		DemoOptions: gpupass.DemoOptions{ExampleDir: filepath.Join(testutil.RepoRoot(t), "examples", "train"), Steps: 1},
		Getenv:      func(string) string { return "" },
	}, &out)
	if err == nil {
		t.Fatalf("up --demo with %s succeeded; output:\n%s", py, out.String())
	}
	for _, w := range []string{py, "torch", "numpy==1.24.2 (not installed)", demoAptLine} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("error %q does not name %q", err, w)
		}
	}
	if _, err := os.Stat(state); !os.IsNotExist(err) {
		t.Errorf("state dir %s exists (%v): something started before the check", state, err)
	}
}

// Stubs for TestSetupDemo, first on PATH: a machine where dpkg knows
// only what $STUB_DIR/installed lists, and an apt-get that records what
// it is asked and "installs" by writing the listed packages there and,
// when $STUB_SITE is set, importable torch and numpy into that
// site-packages (as Debian's packages do for /usr/bin/python3). No real
// apt-get ever runs.
const (
	stubDpkgQuery = `#!/bin/sh
pkg=""; for a in "$@"; do pkg="$a"; done
if grep -qx "$pkg" "$STUB_DIR/installed" 2>/dev/null; then printf 'install ok installed'; exit 0; fi
echo "dpkg-query: no packages found matching $pkg" >&2; exit 1
`
	stubAptGet = `#!/bin/sh
echo "$*" >> "$STUB_DIR/apt.log"
[ "$1" = update ] && exit 0
for a in "$@"; do case "$a" in -*|install) ;; *) echo "$a" >> "$STUB_DIR/installed";; esac; done
if [ -n "$STUB_SITE" ]; then
	mkdir -p "$STUB_SITE/torch" "$STUB_SITE/numpy"
	echo "__version__ = '1.13.0'" > "$STUB_SITE/torch/__init__.py"
	echo "__version__ = '1.24.2'" > "$STUB_SITE/numpy/__init__.py"
fi
`
)

// TestSetupDemo runs `scripts/setup.sh demo` (the first step of `make
// demo`) on a simulated fresh machine: the demo's interpreter is a bare
// venv and dpkg knows none of the demo's packages. As root it must ask
// apt-get for python3-torch and python3-numpy, then pass, and ask nothing
// on a second run; as another user it must print the exact apt-get line
// and fail; and an interpreter apt cannot serve must fail, named.
func TestSetupDemo(t *testing.T) {
	testutil.NeedRoot(t)
	t.Parallel()
	bash := testutil.Tool(t, "bash")
	testutil.Tool(t, "go") // scripts/lib.sh asks go env for its tool dir
	script := filepath.Join(testutil.RepoRoot(t), "scripts", "setup.sh")

	tests := []struct {
		name       string
		python     string // "venv": a bare venv; else this path
		installed  string // what the stub dpkg knows at the start
		aptWorks   bool   // the stub apt-get makes torch and numpy importable
		asNobody   bool
		wantOK     bool
		wantApt    []string // lines apt-get is asked, in order
		wantStderr []string
	}{
		{
			name: "fresh machine as root installs the demo's packages", python: "venv", aptWorks: true, wantOK: true,
			wantApt:    []string{"update -qq", "install -y -qq --no-install-recommends python3 python3-torch python3-numpy"},
			wantStderr: []string{"cannot import torch and numpy", "setup: apt-get install python3 python3-torch python3-numpy"},
		},
		{
			name: "not root prints the exact apt-get line and fails", python: "venv", asNobody: true,
			wantStderr: []string{"sudo " + demoAptLine},
		},
		{
			name: "an interpreter Debian's packages do not serve is named", python: "venv",
			installed:  "python3\npython3-torch\npython3-numpy\n",
			wantStderr: []string{"still cannot import torch and numpy", "unset GPUPASS_PYTHON"},
		},
		{
			name: "Debian python3 with the packages asks apt nothing", python: debianPython, wantOK: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// Readable by nobody: the not-root case runs the script as it.
			dir := testutil.TempDirMode(t, 0o755)
			stubs := filepath.Join(dir, "stubs")
			if err := os.Mkdir(stubs, 0o755); err != nil {
				t.Fatal(err)
			}
			for name, body := range map[string]string{"dpkg-query": stubDpkgQuery, "apt-get": stubAptGet} {
				if err := os.WriteFile(filepath.Join(stubs, name), []byte(body), 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if err := os.WriteFile(filepath.Join(stubs, "installed"), []byte(tt.installed), 0o644); err != nil {
				t.Fatal(err)
			}
			py, site := tt.python, ""
			if py == "venv" {
				py, site = bareVenv(t, dir, nil)
			} else {
				needDebianTorch(t)
			}
			if !tt.aptWorks {
				site = ""
			}
			env := []string{"PATH=" + stubs + ":" + os.Getenv("PATH"), "HOME=" + dir, "GPUPASS_PYTHON=" + py,
				"STUB_DIR=" + stubs, "STUB_SITE=" + site, "LANG=C"}
			run := func() (string, bool) {
				cmd := exec.Command(bash, script, "demo")
				cmd.Env = env
				if tt.asNobody {
					cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
				}
				_, stderr, code := testutil.Run(t, cmd)
				return stderr, code == 0
			}
			stderr, ok := run()
			if ok != tt.wantOK {
				t.Fatalf("setup.sh demo ok=%v, want %v; stderr:\n%s", ok, tt.wantOK, stderr)
			}
			for _, w := range tt.wantStderr {
				if !strings.Contains(stderr, w) {
					t.Errorf("stderr does not say %q:\n%s", w, stderr)
				}
			}
			apt := readLines(t, filepath.Join(stubs, "apt.log"))
			if strings.Join(apt, "\n") != strings.Join(tt.wantApt, "\n") {
				t.Errorf("apt-get was asked %q, want %q", apt, tt.wantApt)
			}
			if tt.wantOK {
				// Idempotent: everything is there now, so nothing is asked.
				if stderr, ok := run(); !ok {
					t.Fatalf("second run failed:\n%s", stderr)
				}
				if again := readLines(t, filepath.Join(stubs, "apt.log")); len(again) != len(apt) {
					t.Errorf("second run asked apt-get %q", again[len(apt):])
				}
			}
		})
	}
}

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSpace(string(b)), "\n")
}
