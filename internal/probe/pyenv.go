package probe

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/wheel/coremeta"
)

// Starting Python as the node agent (root) over files a job or a wheel
// bundle could write would run their code with the agent's key in reach:
// Python runs code at start from PYTHONSTARTUP, PYTHONPATH (and a
// sitecustomize/usercustomize on it), PYTHONHOME, PYTHONUSERBASE (the user
// site), the current directory (first on sys.path for -c), *.pth files
// and sitecustomize in site-packages, and PYTHONINSPECT, PYTHONWARNINGS or
// PYTHONBREAKPOINT name modules to import. The agent therefore starts
// only the node's own interpreter (or a venv with nothing installed yet),
// isolated (-I: no PYTHON* variable, no user site, no current directory
// on sys.path), without writing bytecode (-B), in "/", with an environment
// built from the allow-list below; it reads what a run's environment has
// installed from the files' metadata (InstalledVersions), never by
// importing it.

// isolatedVars are the variables an isolated interpreter of the agent
// keeps from the agent's own environment: what torch needs to find the
// driver and CUDA, and the locale. Nothing named PYTHON*.
var isolatedVars = []string{"PATH", "LD_LIBRARY_PATH", "CUDA_HOME", "CUDA_PATH", "CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_DRIVER_CAPABILITIES", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"}

// IsolatedEnv filters env (nil: this process's) to the allow-list.
func IsolatedEnv(env []string) []string {
	if env == nil {
		env = os.Environ()
	}
	out := make([]string, 0, len(isolatedVars))
	for _, kv := range env {
		k, _, _ := strings.Cut(kv, "=")
		for _, v := range isolatedVars {
			if k == v {
				out = append(out, kv)
			}
		}
	}
	return out
}

// isolated makes cmd an isolated start: -I -B go before the script by
// the caller; here the environment and the directory.
func isolated(cmd *exec.Cmd, env []string) {
	cmd.Env = IsolatedEnv(env)
	cmd.Dir = "/"
	cmd.WaitDelay = WaitDelay
}

// Layout is what an interpreter says of its environment.
type Layout struct {
	Version    string            `json:"version"`
	Executable string            `json:"executable"`
	Prefix     string            `json:"prefix"`
	SysPath    []string          `json:"sys_path"`
	Paths      map[string]string `json:"paths"`
	Platform   string            `json:"platform"`
	GLIBC      string            `json:"glibc"`
}

const layoutScript = `
import sys, json, os, sysconfig
try:
    libc = os.confstr("CS_GNU_LIBC_VERSION") or ""
except (ValueError, OSError):
    libc = ""
sys.stdout.write("\nGPUPASS_PROBE " + json.dumps({"version": "%d.%d.%d" % tuple(sys.version_info[:3]),
    "executable": sys.executable, "prefix": sys.prefix, "sys_path": [p for p in sys.path if p],
    "paths": sysconfig.get_paths(), "platform": sysconfig.get_platform(), "glibc": libc.replace("glibc ", "")}) + "\n")
`

// ReadLayout starts exe isolated and asks for its sys.path, install
// scheme and platform. exe must be the node's own interpreter or a venv
// of it that holds nothing yet: site still runs the .pth files of the
// site-packages it finds.
func ReadLayout(ctx context.Context, exe string, env []string) (Layout, error) {
	tctx, cancel := context.WithTimeout(ctx, toolTimeout)
	defer cancel()
	cmd := exec.CommandContext(tctx, exe, "-I", "-B", "-c", layoutScript)
	isolated(cmd, env)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return Layout{}, fmt.Errorf("%s -I: %w: %s", exe, err, firstLine(stderr.Bytes()))
	}
	const marker = "\nGPUPASS_PROBE "
	i := bytes.LastIndex(out, []byte(marker))
	if i < 0 {
		return Layout{}, fmt.Errorf("%s: no probe answer in its output", exe)
	}
	var l Layout
	if err := json.Unmarshal(bytes.TrimSpace(out[i+len(marker):]), &l); err != nil {
		return Layout{}, fmt.Errorf("%s: malformed probe answer: %w", exe, err)
	}
	return l, nil
}

// maxMetadata bounds one METADATA or PKG-INFO read.
const maxMetadata = 1 << 20

// InstalledVersions finds each of names (normalised, PEP 503) along paths
// (a sys.path, first match wins, as importlib.metadata.version does) from
// the *.dist-info and *.egg-info metadata on disk, without importing
// anything. A name not found maps to "".
func InstalledVersions(paths, names []string) map[string]string {
	out := make(map[string]string, len(names))
	want := map[string]bool{}
	for _, n := range names {
		n = spec.NormalizeName(n)
		want[n] = true
		out[n] = ""
	}
	left := len(want)
	for _, dir := range paths {
		if left == 0 {
			break
		}
		ents, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, e := range ents {
			base := e.Name()
			var meta string
			switch {
			case strings.HasSuffix(base, ".dist-info"):
				meta = filepath.Join(dir, base, "METADATA")
			case strings.HasSuffix(base, ".egg-info") && e.IsDir():
				meta = filepath.Join(dir, base, "PKG-INFO")
			case strings.HasSuffix(base, ".egg-info"):
				meta = filepath.Join(dir, base)
			default:
				continue
			}
			name, _, _ := strings.Cut(base, "-")
			n := spec.NormalizeName(strings.TrimSuffix(strings.TrimSuffix(name, ".dist-info"), ".egg-info"))
			if !want[n] || out[n] != "" {
				continue
			}
			f, err := os.Open(meta)
			if err != nil {
				continue
			}
			b, err := io.ReadAll(io.LimitReader(f, maxMetadata))
			f.Close()
			if err != nil {
				continue
			}
			mname, v := coremeta.NameVersion(b)
			if v == "" || (mname != "" && spec.NormalizeName(mname) != n) {
				continue
			}
			out[n] = v
			left--
		}
	}
	return out
}
