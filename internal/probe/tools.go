package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"
)

// toolTimeout bounds one external probe command: a wedged interpreter
// must not stall the suite forever.
const toolTimeout = 60 * time.Second

// WaitDelay bounds the wait for a stopped tool's output pipes: a process
// it started in the background (a daemon a .pth file spawned, a hung
// compiler driver's child) can hold them open long after the tool itself
// was killed, and the probe must still return. Other packages that run
// Python for the agent use it too.
const WaitDelay = 2 * time.Second

// NVCC probes the CUDA toolkit with `nvcc --version`.
type NVCC struct {
	// Path is nvcc to run; empty looks on PATH, then in /usr/local/cuda/bin.
	Path string
}

// Name implements Probe.
func (NVCC) Name() string { return "nvcc" }

func (p NVCC) resolve() (string, error) {
	if p.Path != "" {
		return exec.LookPath(p.Path)
	}
	if path, err := exec.LookPath("nvcc"); err == nil {
		return path, nil
	}
	return exec.LookPath("/usr/local/cuda/bin/nvcc")
}

// Measure implements Probe.
func (p NVCC) Measure(ctx context.Context) (Section, error) {
	path, err := p.resolve()
	if err != nil {
		where := p.Path
		if where == "" {
			where = "nvcc on PATH or in /usr/local/cuda/bin"
		}
		return NVCCSection{Reason: "not found: " + where}, ctx.Err()
	}
	ctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	// nvcc is --nvcc or found on the agent's own PATH (the operator's),
	// never in a job's or a bundle's files, so the agent may run it.
	cmd := exec.CommandContext(ctx, path, "--version")
	cmd.WaitDelay = WaitDelay
	out, err := cmd.Output()
	if err != nil {
		if ctxErr := context.Cause(ctx); ctxErr != nil && !errors.Is(ctxErr, context.DeadlineExceeded) {
			return nil, ctxErr
		}
		return NVCCSection{Path: path, Reason: fmt.Sprintf("%s --version: %v", path, err)}, nil
	}
	v, err := ParseNVCCVersion(out)
	if err != nil {
		return NVCCSection{Path: path, Reason: err.Error()}, nil
	}
	return NVCCSection{Found: true, Path: path, Version: v}, nil
}

// StateKey implements Keyed: nvcc's answer changes only when the binary
// at the resolved path does.
func (p NVCC) StateKey(_ context.Context, _ Section) (string, bool) {
	path, err := p.resolve()
	if err != nil {
		return "absent", true
	}
	return statKey(path)
}

var nvccRe = regexp.MustCompile(`(?m)release (\d+\.\d+), V(\d+\.\d+\.\d+)`)

// ParseNVCCVersion extracts the full toolkit version (12.1.105) from
// `nvcc --version` output.
func ParseNVCCVersion(out []byte) (string, error) {
	m := nvccRe.FindSubmatch(out)
	if m == nil {
		return "", fmt.Errorf("nvcc --version: no \"release X.Y, VX.Y.Z\" line in %q", firstLine(out))
	}
	return string(m[2]), nil
}

func firstLine(b []byte) string {
	s := strings.TrimSpace(string(b))
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		s = s[:i]
	}
	if len(s) > 80 {
		s = s[:80]
	}
	return s
}

func statKey(paths ...string) (string, bool) {
	var b strings.Builder
	for _, p := range paths {
		real, err := filepath.EvalSymlinks(p)
		if err != nil {
			fmt.Fprintf(&b, "%s:absent;", p)
			continue
		}
		fi, err := os.Stat(real)
		if err != nil {
			return "", false
		}
		fmt.Fprintf(&b, "%s:%d:%d;", real, fi.Size(), fi.ModTime().UnixNano())
	}
	return b.String(), true
}

// Python probes an interpreter: its version, torch, torch's CUDA and
// cuDNN, torch.__config__.show(), and the installed versions of Packages
// through importlib.metadata.
type Python struct {
	// Exe is the interpreter (default python3, looked up on PATH).
	Exe string
	// Packages are names whose installed versions to report.
	Packages []string
	// Env is the interpreter's environment (nil: this process's). The
	// agent measures a run's Python with the run's environment: an
	// interpreter with a run's packages runs their code (.pth files,
	// torch) and must not see the agent's secrets.
	Env []string
	// Isolated starts the interpreter as the node agent must (see
	// pyenv.go): -I -B, in "/", with Env cut to the allow-list. The agent
	// only ever measures the node's own interpreter this way; a run's
	// venv is read from its metadata instead.
	Isolated bool
}

// DefaultPython is the interpreter `gpupass validate --local` probes and
// `gpupass up` runs jobs with unless told otherwise: one default, so the
// check and the run see the same Python. Debian's python3-torch and
// python3-numpy serve only the system interpreter, not a python3 that a
// venv or conda puts first on PATH.
const DefaultPython = "/usr/bin/python3"

// Name implements Probe.
func (Python) Name() string { return "python" }

func (p Python) exe() string {
	if p.Exe == "" {
		return "python3"
	}
	return p.Exe
}

// pythonScript prints one marked JSON line, so that anything torch or
// site hooks print on stdout cannot be mistaken for the answer.
const pythonScript = `
import sys, json
out = {"version": "%d.%d.%d" % tuple(sys.version_info[:3]), "sys_version": sys.version,
       "executable": sys.executable, "paths": [p for p in sys.path if p]}
try:
    import torch
    out["torch"] = str(torch.__version__)
    out["torch_cuda"] = torch.version.cuda or ""
    try:
        v = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
        out["cudnn"] = v
    except Exception:
        out["cudnn"] = None
    try:
        out["config"] = torch.__config__.show()
    except Exception as e:
        out["config"] = "unavailable: %r" % (e,)
except Exception as e:
    out["torch_error"] = "%s: %s" % (type(e).__name__, e)
pk = {}
try:
    import importlib.metadata as md
    for name in json.loads(sys.argv[1]):
        try:
            pk[name] = md.version(name)
        except md.PackageNotFoundError:
            pk[name] = ""
except ImportError:
    pass
out["packages"] = pk
sys.stdout.write("\nGPUPASS_PROBE " + json.dumps(out) + "\n")
`

type pythonOut struct {
	Version    string            `json:"version"`
	SysVersion string            `json:"sys_version"`
	Executable string            `json:"executable"`
	Paths      []string          `json:"paths"`
	Torch      string            `json:"torch"`
	TorchCUDA  string            `json:"torch_cuda"`
	CuDNN      *int              `json:"cudnn"`
	Config     string            `json:"config"`
	TorchError string            `json:"torch_error"`
	Packages   map[string]string `json:"packages"`
}

// Measure implements Probe.
func (p Python) Measure(ctx context.Context) (Section, error) {
	exe, err := exec.LookPath(p.exe())
	if err != nil {
		return PythonSection{Reason: "not found: " + p.exe()}, ctx.Err()
	}
	names := make([]string, 0, len(p.Packages))
	for _, n := range p.Packages {
		names = append(names, NormalizePackage(n))
	}
	sort.Strings(names)
	arg, _ := json.Marshal(names)
	tctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	var cmd *exec.Cmd
	if p.Isolated {
		cmd = exec.CommandContext(tctx, exe, "-I", "-B", "-c", pythonScript, string(arg))
		isolated(cmd, p.Env)
	} else {
		cmd = exec.CommandContext(tctx, exe, "-c", pythonScript, string(arg))
		cmd.WaitDelay = WaitDelay
		// A user's PYTHONSTARTUP or a broken PYTHONHOME must not change
		// the answer; PYTHONPATH is kept because it is part of the
		// runtime (gpupass validate --local measures the user's own).
		env := p.Env
		if env == nil {
			env = os.Environ()
		}
		cmd.Env = append(env[:len(env):len(env)], "PYTHONSTARTUP=", "PYTHONDONTWRITEBYTECODE=1")
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return PythonSection{Executable: exe, Reason: fmt.Sprintf("%s: %v: %s", exe, err, firstLine(stderr.Bytes()))}, nil
	}
	return parsePythonOutput(exe, out)
}

func parsePythonOutput(exe string, out []byte) (Section, error) {
	const marker = "GPUPASS_PROBE "
	i := bytes.LastIndex(out, []byte("\n"+marker))
	if i < 0 {
		return PythonSection{Executable: exe, Reason: fmt.Sprintf("%s: no probe answer in its output", exe)}, nil
	}
	var po pythonOut
	if err := json.Unmarshal(bytes.TrimSpace(out[i+1+len(marker):]), &po); err != nil {
		return PythonSection{Executable: exe, Reason: fmt.Sprintf("%s: malformed probe answer: %v", exe, err)}, nil
	}
	s := PythonSection{
		Found: true, Executable: exe, Version: po.Version, SysVersion: po.SysVersion,
		Torch: po.Torch, TorchCUDA: po.TorchCUDA, TorchConfig: po.Config,
		Packages: po.Packages, SitePaths: po.Paths,
	}
	if po.Torch == "" {
		s.TorchReason = "not found"
		if po.TorchError != "" {
			s.TorchReason = "not found: " + po.TorchError
		}
	}
	if po.CuDNN != nil {
		s.CuDNN = CuDNNVersion(*po.CuDNN)
	}
	return s, nil
}

// CuDNNVersion renders torch.backends.cudnn.version(): cuDNN 8 encodes
// 8.9.2 as 8902, cuDNN 9 encodes 9.1.0 as 90100.
func CuDNNVersion(v int) string {
	if v >= 90000 {
		return fmt.Sprintf("%d.%d.%d", v/10000, (v%10000)/100, v%100)
	}
	return fmt.Sprintf("%d.%d.%d", v/1000, (v%1000)/100, v%100)
}

// StateKey implements Keyed: the interpreter binary and the directories
// on its sys.path. Installing or removing a package creates or deletes a
// *.dist-info directory, which changes its parent's modification time.
func (p Python) StateKey(_ context.Context, prev Section) (string, bool) {
	exe, err := exec.LookPath(p.exe())
	if err != nil {
		return "absent", true
	}
	ps, ok := prev.(PythonSection)
	if !ok || !ps.Found {
		return "", false
	}
	names := append([]string(nil), p.Packages...)
	sort.Strings(names)
	key, ok := statKey(append([]string{exe}, ps.SitePaths...)...)
	return key + "|" + strings.Join(names, ","), ok
}

// FIPS reads the kernel's FIPS switch.
type FIPS struct {
	// Path defaults to /proc/sys/crypto/fips_enabled.
	Path string
}

// Name implements Probe.
func (FIPS) Name() string { return "fips" }

// Measure implements Probe.
func (p FIPS) Measure(ctx context.Context) (Section, error) {
	path := p.Path
	if path == "" {
		path = "/proc/sys/crypto/fips_enabled"
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		// The kernel was built without FIPS support: it is off.
		return FIPSSection{Reason: "not found: " + path}, ctx.Err()
	}
	if err != nil {
		return FIPSSection{Reason: fmt.Sprintf("reading %s: %v", path, err)}, ctx.Err()
	}
	switch strings.TrimSpace(string(b)) {
	case "1":
		return FIPSSection{Found: true, Enabled: true}, ctx.Err()
	case "0":
		return FIPSSection{Found: true}, ctx.Err()
	}
	return FIPSSection{Reason: fmt.Sprintf("%s: unexpected content %q", path, firstLine(b))}, ctx.Err()
}
