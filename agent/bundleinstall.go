package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/flagenv"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// BundleInstaller installs a run's wheel bundle (spec runtime.bundle)
// before its command starts: pull by digest into the run's work dir,
// verified blob by blob and wheel by wheel (bundle.Pull), then `pip
// install --no-index --find-links` of the spec's pinned packages into a
// per-run virtual environment.
//
// Why a venv (`python -m venv --system-site-packages`) and not `pip
// install --target` + PYTHONPATH: the node's own Python is never
// modified, yet what the node image already provides (torch, CUDA
// libraries) still satisfies the bundle's dependencies; `--target` makes
// pip ignore installed packages, so every dependency, torch included,
// would have to be in the bundle. The venv's site-packages come before
// the system's on sys.path, so the bundle's pinned versions win, and the
// package check of runtime-init runs in the venv's interpreter: it checks
// exactly what the command will import.
//
// The zero value talks TLS and takes credentials from the docker config.
type BundleInstaller struct {
	// Registry is how the registry is reached: --registry-plain-http,
	// GPUPASS_REGISTRY_USERNAME/PASSWORD, else the docker config keychain.
	Registry bundle.RegistryOptions
	Log      *slog.Logger
}

// bundleDir is the directory in a run's work dir that holds the pulled
// wheelhouse and the venv; a leading dot keeps it out of the way of the
// job's own files.
const bundleDir = ".gpupass-bundle"

// Check returns the runtime-init step for a run's spec, or nil when the
// spec needs no bundle. A spec with no-internet-access but no bundle gets
// a step that fails the run: the validator refuses such a spec, and a
// node must not start a run that would have nothing to install from.
func (b *BundleInstaller) Check(sp *spec.Spec) *executor.RuntimeCheck {
	if sp == nil || (sp.Runtime.Bundle == "" && !sp.Security.NoInternetAccess) {
		return nil
	}
	return &executor.RuntimeCheck{Name: "bundle", Prepare: func(ctx context.Context, job *executor.Job, emit executor.Emit) (string, error) {
		detail, err := b.install(ctx, sp, job, emit)
		if err != nil {
			emit(events.Error, events.RuntimeBundle, err.Error(), map[string]string{"bundle": sp.Runtime.Bundle})
		}
		return detail, err
	}}
}

func (b *BundleInstaller) log() *slog.Logger {
	if b.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return b.Log
}

func (b *BundleInstaller) install(ctx context.Context, sp *spec.Spec, job *executor.Job, emit executor.Emit) (string, error) {
	ref := sp.Runtime.Bundle
	if ref == "" {
		return "", errors.New("spec has security.no-internet-access but no runtime.bundle: the run would have nothing to install from; set runtime.bundle to REPO@sha256:... (printed by `gpupass bundle push`)")
	}
	if sp.Security.NoInternetAccess && !strings.Contains(ref, "@") {
		return "", fmt.Errorf("spec runtime.bundle %q is a tag: a run with security.no-internet-access installs only a bundle pinned by digest; set runtime.bundle to REPO@sha256:... (`gpupass bundle push` prints it)", ref)
	}
	pins, err := bundle.ParsePins(sp.Runtime.Packages)
	if err != nil {
		return "", fmt.Errorf("spec %w", err)
	}
	root := filepath.Join(job.WorkRoot, job.AllocID, bundleDir)
	// A run executed again here (the agent restarted) starts clean: a
	// half-built venv from before must not be trusted.
	if err := os.RemoveAll(root); err != nil {
		return "", fmt.Errorf("clearing %s: %w", root, err)
	}
	house := filepath.Join(root, "wheelhouse")
	emit(events.Info, events.RuntimeBundle, "pulling bundle "+ref, map[string]string{"bundle": ref})
	res, err := bundle.Pull(ctx, ref, house, bundle.PullOptions{
		Registry:      b.Registry,
		Logger:        b.log(),
		RequireDigest: sp.Security.NoInternetAccess,
	})
	if err != nil {
		return "", fmt.Errorf("pulling bundle: %w", err)
	}
	var size int64
	for _, w := range res.Wheels {
		size += w.Size
	}
	emit(events.Info, events.RuntimeBundle,
		fmt.Sprintf("bundle %s pulled and verified: %d wheels, %d bytes (blob digests, RECORD hashes, lock)", res.Reference, len(res.Wheels), size),
		map[string]string{"digest": res.Digest, "reference": res.Reference, "wheels": fmt.Sprint(len(res.Wheels))})

	base := job.Python
	if base == "" {
		base = "python3"
	}
	venv := filepath.Join(root, "venv")
	// Building the venv and installing into it run the bundle's
	// interpreter and pip (and whatever .pth a wheel brings) before the
	// command: they get the job's environment, not the agent's secrets.
	env := job.Environ()
	if err := makeVenv(ctx, base, venv, env); err != nil {
		return "", err
	}
	py := filepath.Join(venv, "bin", "python")
	reqs := make([]string, len(pins))
	for i, p := range pins {
		reqs[i] = p.Name + "==" + p.Version
	}
	report := filepath.Join(root, "pip-report.json")
	var pipOut bytes.Buffer
	if len(reqs) > 0 {
		err := bundle.Install(ctx, house, reqs, bundle.InstallOptions{Python: py, Report: report, Stdout: &pipOut, Stderr: &pipOut, Env: env})
		if err != nil {
			return "", fmt.Errorf("installing from bundle %s: %w: %s", res.Digest, err, tail(pipOut.String(), 12))
		}
	}
	installed, err := readPipReport(report, len(reqs) > 0)
	if err != nil {
		return "", err
	}
	byFile := map[string]bundle.Wheel{}
	for _, w := range res.Wheels {
		byFile[w.File] = w
	}
	fromBundle := map[string]bool{}
	for _, in := range installed {
		w, ok := byFile[in.file]
		if !ok {
			// --no-index and --find-links name only the wheelhouse,
			// so this cannot come from elsewhere; say so if it does.
			return "", fmt.Errorf("pip installed %s %s from %s, which is not a wheel of bundle %s", in.name, in.version, in.file, res.Digest)
		}
		fromBundle[spec.NormalizeName(in.name)] = true
		emit(events.Info, events.RuntimeBundle, fmt.Sprintf("installed %s %s from %s (bundle %s)", in.name, in.version, w.File, res.Digest),
			map[string]string{"package": in.name, "version": in.version, "wheel": w.File, "sha256": w.SHA256, "digest": res.Digest, "source": "bundle"})
	}
	for _, p := range pins {
		if !fromBundle[p.Name] {
			// pip found it already installed in the node's Python (the
			// venv sees system site-packages); the package check below
			// still verifies the version the command will import.
			emit(events.Info, events.RuntimeBundle, fmt.Sprintf("package %s==%s already provided by the node's Python, not taken from the bundle", p.Name, p.Version),
				map[string]string{"package": p.Name, "version": p.Version, "digest": res.Digest, "source": "node"})
		}
	}
	from := enterVenv(job, venv)
	if from != "" {
		emit(events.Info, events.RuntimeBundle, fmt.Sprintf("command runs in the bundle's environment: %s -> %s", from, job.Command[0]), map[string]string{"venv": venv})
	}
	return fmt.Sprintf("bundle %s installed into %s (%d from the bundle, %d already on the node)", res.Reference, venv, len(installed), len(pins)-countTrue(pins, fromBundle)), nil
}

func countTrue(pins []bundle.Pin, m map[string]bool) int {
	n := 0
	for _, p := range pins {
		if m[p.Name] {
			n++
		}
	}
	return n
}

// makeVenv creates the run's venv without pip of its own (pip comes from
// the system site-packages the venv sees, so no ensurepip run and no
// download); a Python without pip gets the one ensurepip bundles, offline.
// env is the environment of each step.
func makeVenv(ctx context.Context, python, dir string, env []string) error {
	command := func(name string, args ...string) *exec.Cmd {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Env, cmd.WaitDelay = env, probe.WaitDelay
		return cmd
	}
	run := func(name string, args ...string) error {
		out, err := command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tail(string(out), 6))
		}
		return nil
	}
	if err := run(python, "-m", "venv", "--system-site-packages", "--without-pip", dir); err != nil {
		return fmt.Errorf("creating the run's venv: %w", err)
	}
	py := filepath.Join(dir, "bin", "python")
	if command(py, "-m", "pip", "--version").Run() == nil {
		return nil
	}
	if err := run(py, "-m", "ensurepip", "--default-pip"); err != nil {
		return fmt.Errorf("the run's Python %s has no pip: %w", python, err)
	}
	return nil
}

// enterVenv points the job at the venv: its interpreter for the package
// check, VIRTUAL_ENV and PATH for the command and what it starts, and
// the command itself when it names Python directly (os/exec resolves a
// bare name with the agent's PATH, not the job's, and an absolute
// /usr/bin/python3 would bypass the venv). It returns the command's old
// first word when it was rewritten.
func enterVenv(job *executor.Job, venv string) string {
	bin := filepath.Join(venv, "bin")
	base := job.Python
	job.Python = filepath.Join(bin, "python")
	env := job.Environ()
	path := os.Getenv("PATH")
	out := make([]string, 0, len(env)+2)
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "PATH":
			path = v
			continue
		case "VIRTUAL_ENV", "PYTHONHOME":
			continue
		}
		out = append(out, kv)
	}
	out = append(out, "VIRTUAL_ENV="+venv, "PATH="+bin+string(os.PathListSeparator)+path)
	job.BaseEnv = out
	if len(job.Command) == 0 {
		return ""
	}
	cmd0 := job.Command[0]
	var to string
	switch {
	case !strings.Contains(cmd0, "/"):
		if st, err := os.Stat(filepath.Join(bin, cmd0)); err == nil && !st.IsDir() {
			to = filepath.Join(bin, cmd0)
		}
	case sameFile(cmd0, base):
		to = job.Python
	}
	if to == "" {
		return ""
	}
	job.Command = append([]string{to}, job.Command[1:]...)
	return cmd0
}

// sameFile reports whether two interpreter names resolve to one file
// (/usr/bin/python3 and python3 -> python3.11).
func sameFile(a, b string) bool {
	resolve := func(p string) string {
		if !strings.Contains(p, "/") {
			lp, err := exec.LookPath(p)
			if err != nil {
				return ""
			}
			p = lp
		}
		r, err := filepath.EvalSymlinks(p)
		if err != nil {
			return ""
		}
		return r
	}
	ra, rb := resolve(a), resolve(b)
	return ra != "" && ra == rb
}

type pipInstalled struct{ name, version, file string }

// readPipReport reads pip's --report (JSON, pip >= 22.2): what it
// installed and from which file.
func readPipReport(file string, want bool) ([]pipInstalled, error) {
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) && !want {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading pip's install report: %w (pip 22.2 or newer writes it)", err)
	}
	var rep struct {
		Install []struct {
			Metadata struct {
				Name    string `json:"name"`
				Version string `json:"version"`
			} `json:"metadata"`
			DownloadInfo struct {
				URL string `json:"url"`
			} `json:"download_info"`
		} `json:"install"`
	}
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("reading pip's install report %s: %w", file, err)
	}
	out := make([]pipInstalled, 0, len(rep.Install))
	for _, in := range rep.Install {
		u, err := url.Parse(in.DownloadInfo.URL)
		if err != nil {
			return nil, fmt.Errorf("pip's install report: %s %s: %w", in.Metadata.Name, in.Metadata.Version, err)
		}
		out = append(out, pipInstalled{name: in.Metadata.Name, version: in.Metadata.Version, file: path.Base(u.Path)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// tail keeps the last n lines of pip's output for an error message.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// RegistryFlags are the agent's flags for the registry that serves wheel
// bundles. Without a user name, credentials come from the docker config
// (~/.docker/config.json of the agent's user, $DOCKER_CONFIG, credential
// helpers).
type RegistryFlags struct {
	PlainHTTP bool
	Username  string
	Password  string
}

// AddFlags registers the registry flags (GPUPASS_REGISTRY_USERNAME,
// GPUPASS_REGISTRY_PASSWORD or GPUPASS_REGISTRY_PASSWORD_FILE, ...).
func (r *RegistryFlags) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.BoolVar(&r.PlainHTTP, "registry-plain-http", false, "pull wheel bundles over plain HTTP (loopback test registries only; TLS otherwise)")
	f.StringVar(&r.Username, "registry-username", "", "wheel-bundle registry user name (default: docker config credentials)")
	f.StringVar(&r.Password, "registry-password", "", "wheel-bundle registry password or token (secret; prefer GPUPASS_REGISTRY_PASSWORD_FILE)")
	flagenv.MarkSecret("registry-password")
}

func (r *RegistryFlags) validate() error {
	if (r.Username == "") != (r.Password == "") {
		return errors.New("--registry-username and --registry-password go together (GPUPASS_REGISTRY_USERNAME/PASSWORD)")
	}
	return nil
}

func (r *RegistryFlags) options() bundle.RegistryOptions {
	return bundle.RegistryOptions{
		PlainHTTP: r.PlainHTTP, Username: r.Username, Password: r.Password,
		Retry: bundle.DefaultRetry, UserAgent: "gpupass-agent",
	}
}
