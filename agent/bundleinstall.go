package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/wheel"
)

// BundleInstaller installs a run's wheel bundle (spec runtime.bundle)
// before its command starts: pull by digest, verified blob by blob and
// wheel by wheel (bundle.Pull), then unpack its wheels into a per-run
// virtual environment with gpupass's own installer (wheel.Installer).
//
// The agent runs as root and holds the node's identity key, and a wheel
// can carry code that Python runs at every start (a .pth file,
// sitecustomize, usercustomize, an entry point named like the
// interpreter) or at install time (pip's build hooks). So the agent never
// starts an interpreter over the bundle's files: it creates the venv with
// the node's own interpreter in isolated mode before anything is in it,
// unpacks the wheels in Go (no pip, no byte-compilation), and reads the
// installed versions from the *.dist-info metadata (probe.InstalledVersions).
// The bundle's code runs only in the job's interpreter, as the job's
// user. The venv lives under the state dir, outside the job's work dir,
// owned by the agent and read-only to the job: the job cannot change
// the environment that was measured.
//
// Why a venv (--system-site-packages) and not a --target dir on
// PYTHONPATH: the node's own Python is never modified, yet what the node
// image already provides (torch, CUDA libraries) still satisfies the
// bundle's dependencies; the venv's site-packages come first on sys.path,
// so the bundle's pinned versions win.
//
// The zero value talks TLS and takes credentials from the docker config.
type BundleInstaller struct {
	// Registry is how the registry is reached: --plain-http,
	// GPUPASS_REGISTRY_USERNAME/PASSWORD, else the docker config keychain.
	Registry bundle.RegistryOptions
	Log      *slog.Logger

	VerifyRecord bool // --verify-record (bundle.PullOptions.VerifyRecord)
}

// bundlesDir is the directory beside the runs' work dirs (WorkRoot's
// parent is the state dir) that holds each run's wheelhouse and venv:
// not in the work dir, which belongs to the job's user.
const bundlesDir = "bundles"

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
	bundles := filepath.Join(filepath.Dir(job.WorkRoot), bundlesDir)
	root := filepath.Join(bundles, job.AllocID)
	// A run executed again here (the agent restarted) starts clean: a
	// half-built venv from before must not be trusted.
	if err := os.RemoveAll(root); err != nil {
		return "", fmt.Errorf("clearing %s: %w", root, err)
	}
	pruneBundles(bundles, job.WorkRoot, b.log())
	// 0711 then 0755: the job's user reaches its own venv by name, reads
	// and runs it, and can neither list the others nor write anything.
	if err := os.MkdirAll(bundles, 0o711); err != nil {
		return "", fmt.Errorf("creating %s: %w", bundles, err)
	}
	if err := os.Chmod(bundles, 0o711); err != nil {
		return "", fmt.Errorf("creating %s: %w", bundles, err)
	}
	if err := os.Mkdir(root, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", root, err)
	}
	if err := os.Chmod(root, 0o755); err != nil {
		return "", fmt.Errorf("creating %s: %w", root, err)
	}
	house := filepath.Join(root, "wheelhouse")
	emit(events.Info, events.RuntimeBundle, "pulling bundle "+ref, map[string]string{"bundle": ref})
	res, err := bundle.Pull(ctx, ref, house, bundle.PullOptions{
		Registry:      b.Registry,
		Logger:        b.log(),
		RequireDigest: sp.Security.NoInternetAccess,
		VerifyRecord:  b.VerifyRecord,
	})
	if err != nil {
		return "", fmt.Errorf("pulling bundle: %w", err)
	}
	var size int64
	for _, w := range res.Wheels {
		size += w.Size
	}
	emit(events.Info, events.RuntimeBundle,
		fmt.Sprintf("bundle %s pulled and verified: %d wheels, %d bytes (%s)", res.Reference, len(res.Wheels), size, res.Checked()),
		map[string]string{"digest": res.Digest, "reference": res.Reference, "wheels": fmt.Sprint(len(res.Wheels))})

	base := job.Python
	if base == "" {
		base = "python3"
	}
	venv := filepath.Join(root, "venv")
	lay, err := makeVenv(ctx, base, venv)
	if err != nil {
		return "", err
	}
	chosen, err := chooseWheels(res.Wheels, pins, lay)
	if err != nil {
		return "", fmt.Errorf("bundle %s: %w", res.Digest, err)
	}
	py := filepath.Join(venv, "bin", "python")
	mm := pythonMinor(lay.Version)
	in := &wheel.Installer{Scheme: wheel.Scheme{
		Purelib: lay.Paths["purelib"], Platlib: lay.Paths["platlib"], Scripts: lay.Paths["scripts"], Data: lay.Paths["data"],
		Headers: filepath.Join(venv, "include", "site", "python"+mm), Python: py,
	}}
	fromBundle := map[string]bool{}
	var hooks []string
	for _, w := range chosen {
		f, err := wheel.ParseFilename(w.File)
		if err != nil {
			return "", fmt.Errorf("bundle %s: %w", res.Digest, err)
		}
		got, err := in.Install(filepath.Join(house, w.File), f)
		if err != nil {
			return "", fmt.Errorf("installing from bundle %s: %w", res.Digest, err)
		}
		fromBundle[spec.NormalizeName(got.Name)] = true
		for _, h := range got.StartupHooks {
			rel, _ := filepath.Rel(venv, h)
			hooks = append(hooks, rel+" ("+w.File+")")
		}
		emit(events.Info, events.RuntimeBundle, fmt.Sprintf("installed %s %s from %s (bundle %s)", got.Name, got.Version, w.File, res.Digest),
			map[string]string{"package": got.Name, "version": got.Version, "wheel": w.File, "sha256": w.SHA256, "digest": res.Digest, "source": "bundle"})
	}
	if len(hooks) > 0 {
		// They run in the job's interpreter as the job's user, which is
		// the job's own code; the agent never starts an interpreter here.
		msg := fmt.Sprintf("bundle %s installs code that Python runs at every start: %s", res.Digest, strings.Join(hooks, ", "))
		if job.RunAs == nil {
			msg += "; the job runs as the agent's own user (no --run-as), so that code can read the agent's identity key"
		}
		emit(events.Warn, events.RuntimeBundle, msg,
			map[string]string{"digest": res.Digest, "startup_hooks": strings.Join(hooks, ",")})
	}
	var names []string
	for _, p := range sp.Runtime.Packages {
		if r, err := spec.ParseRequirement(p); err == nil {
			names = append(names, probe.NormalizePackage(r.Name))
		}
	}
	sysPath := venvSysPath(lay)
	have := probe.InstalledVersions(sysPath, names)
	for _, p := range pins {
		if fromBundle[p.Name] {
			continue
		}
		if have[p.Name] == "" {
			return "", fmt.Errorf("pin %s is neither in bundle %s nor installed in the node's Python %s", p.Raw, res.Digest, base)
		}
		// The venv sees the node's site-packages; the package check
		// verifies the version the command will import.
		emit(events.Info, events.RuntimeBundle, fmt.Sprintf("package %s==%s already provided by the node's Python, not taken from the bundle", p.Name, p.Version),
			map[string]string{"package": p.Name, "version": p.Version, "digest": res.Digest, "source": "node"})
	}
	if fromBundle["torch"] {
		emit(events.Info, events.RuntimeBundle, "torch comes from the bundle: the agent does not import it (it would run the bundle's code as the agent), so the run report's torch and CUDA facts are the node's Python's",
			map[string]string{"digest": res.Digest})
	}
	if err := sealVenv(venv); err != nil {
		return "", err
	}
	from := enterVenv(job, venv)
	job.Measured = &executor.MeasuredPython{Exe: job.Python, Section: probe.PythonSection{
		Found: true, Executable: py, Version: lay.Version, Packages: have, SitePaths: sysPath,
		TorchReason: "not imported by the agent in a run's venv",
	}}
	if from != "" {
		emit(events.Info, events.RuntimeBundle, fmt.Sprintf("command runs in the bundle's environment: %s -> %s", from, job.Command[0]), map[string]string{"venv": venv})
	}
	return fmt.Sprintf("bundle %s installed into %s (%d from the bundle, %d already on the node)", res.Reference, venv, len(chosen), len(pins)-countTrue(pins, fromBundle)), nil
}

// venvSysPath is the venv's sys.path as its interpreter reads it once the
// bundle is in: the layout was read before, when site-packages was empty
// and so held no .pth that could add to it. A .pth of the bundle adds
// directories for the job, which are the bundle's own.
func venvSysPath(lay probe.Layout) []string {
	out := append([]string(nil), lay.SysPath...)
	for _, d := range []string{lay.Paths["purelib"], lay.Paths["platlib"]} {
		found := false
		for _, p := range out {
			found = found || p == d
		}
		if !found {
			out = append([]string{d}, out...)
		}
	}
	return out
}

func pythonMinor(v string) string {
	parts := strings.SplitN(v, ".", 3)
	if len(parts) < 2 {
		return v
	}
	return parts[0] + "." + parts[1]
}

// chooseWheels picks what to install: for each distribution of the
// bundle one wheel that installs on the venv's interpreter (the pinned
// version when the spec pins it). The bundle is the run's lock, so its
// unpinned dependencies go in too, as pip resolving the pins from it did.
// A pin the bundle has only in another version is refused.
func chooseWheels(ws []bundle.Wheel, pins []bundle.Pin, lay probe.Layout) ([]bundle.Wheel, error) {
	t := wheel.Target{Python: lay.Version, OS: "linux", GLIBC: lay.GLIBC}
	if _, arch, ok := strings.Cut(lay.Platform, "-"); ok {
		t.Arch = arch
	}
	if t.GLIBC == "" {
		t.GLIBC = "2.17"
	}
	tags, err := wheel.SupportedTags(t)
	if err != nil {
		return nil, fmt.Errorf("the run's Python %s on %s: %w", lay.Version, lay.Platform, err)
	}
	pinned := map[string]bundle.Pin{}
	for _, p := range pins {
		pinned[p.Name] = p
	}
	byName := map[string][]bundle.Wheel{}
	var order []string
	for _, w := range ws {
		f, err := wheel.ParseFilename(w.File)
		if err != nil {
			// Pull accepts only wheels; an sdist never gets here.
			return nil, err
		}
		if !tags.Compatible(f.Tags) {
			continue
		}
		n := f.Name()
		if p, ok := pinned[n]; ok {
			// A version that is not PEP 440 cannot satisfy a pin.
			if match, err := spec.PinMatches(p.Version, f.Version); err != nil || !match {
				continue
			}
		}
		if _, seen := byName[n]; !seen {
			order = append(order, n)
		}
		byName[n] = append(byName[n], w)
	}
	var out []bundle.Wheel
	for _, n := range order {
		cands := byName[n]
		sort.Slice(cands, func(i, j int) bool { return cands[i].File < cands[j].File })
		out = append(out, cands[0])
	}
	for _, w := range ws {
		f, _ := wheel.ParseFilename(w.File)
		if p, ok := pinned[f.Name()]; ok && len(byName[f.Name()]) == 0 {
			return nil, fmt.Errorf("pin %s: the bundle's %s does not install on the run's Python %s (%s) or has another version", p.Raw, w.File, lay.Version, lay.Platform)
		}
	}
	return out, nil
}

// sealVenv makes the venv readable by every user and writable by the
// agent alone, whatever the agent's umask: the job's user must run it
// and must not change what was measured.
func sealVenv(venv string) error {
	err := filepath.WalkDir(venv, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.Type()&fs.ModeSymlink != 0 {
			return err
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode().Perm()&^0o022 | 0o444
		if d.IsDir() || mode&0o100 != 0 {
			mode |= 0o111
		}
		if mode == fi.Mode().Perm() {
			return nil
		}
		return os.Chmod(p, mode)
	})
	if err != nil {
		return fmt.Errorf("sealing the run's venv %s: %w", venv, err)
	}
	return nil
}

// pruneBundles removes the venvs of runs whose work dirs are gone
// (KeepRuns pruned them).
func pruneBundles(bundles, workRoot string, log *slog.Logger) {
	ents, err := os.ReadDir(bundles)
	if err != nil {
		return
	}
	for _, e := range ents {
		if _, err := os.Lstat(filepath.Join(workRoot, e.Name())); errors.Is(err, os.ErrNotExist) {
			if err := os.RemoveAll(filepath.Join(bundles, e.Name())); err != nil {
				log.Warn("removing a finished run's venv", "dir", e.Name(), "err", err)
			}
		}
	}
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

// makeVenv creates the run's venv with the node's own interpreter,
// isolated, without pip (nothing is pip-installed into it), and reads its
// layout while it is still empty: no file of the bundle is in it yet, so
// no interpreter start here can run the bundle's code.
func makeVenv(ctx context.Context, python, dir string) (probe.Layout, error) {
	exe, err := exec.LookPath(python)
	if err != nil {
		return probe.Layout{}, fmt.Errorf("the run's Python %s: %w", python, err)
	}
	cmd := exec.CommandContext(ctx, exe, "-I", "-B", "-m", "venv", "--system-site-packages", "--without-pip", dir)
	cmd.Env, cmd.Dir, cmd.WaitDelay = probe.IsolatedEnv(nil), "/", probe.WaitDelay
	if out, err := cmd.CombinedOutput(); err != nil {
		return probe.Layout{}, fmt.Errorf("creating the run's venv: %s -I -m venv: %w: %s", exe, err, tail(string(out), 6))
	}
	lay, err := probe.ReadLayout(ctx, filepath.Join(dir, "bin", "python"), nil)
	if err != nil {
		return probe.Layout{}, fmt.Errorf("reading the run's venv: %w", err)
	}
	for _, k := range []string{"purelib", "platlib", "scripts", "data"} {
		if !strings.HasPrefix(lay.Paths[k], dir+string(filepath.Separator)) && lay.Paths[k] != dir {
			return probe.Layout{}, fmt.Errorf("the run's venv %s: its %s directory is %q, outside the venv", dir, k, lay.Paths[k])
		}
	}
	return lay, nil
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

// tail keeps the last n lines of a tool's output for an error message.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
