package bundle

import (
	"context"
	"fmt"
	"io"
	"os/exec"

	"github.com/gpupass/gpupass/internal/probe"
)

// InstallOptions configure Install.
type InstallOptions struct {
	// Python is the interpreter of the run's environment ("python3" when
	// empty).
	Python string
	// Target, when set, installs into that directory (pip --target)
	// instead of the interpreter's environment.
	Target string
	// Report, when set, is where pip writes its JSON install report
	// (--report, pip >= 22.2): what it installed, from which file.
	Report string
	// Stdout and Stderr receive pip's output.
	Stdout, Stderr io.Writer
	// Env is pip's environment (nil: this process's).
	Env []string
}

// Install installs requirements (e.g. "transformers==4.38.2") from a
// pulled wheelhouse with pip, never touching an index, for a user's own
// machine. The node agent does not use it: pip runs the wheels' code
// (build hooks, .pth files) as whoever runs it, so the agent unpacks
// bundles with wheel.Installer instead. With no requirements it
// installs every wheel of the lock.
func Install(ctx context.Context, dir string, requirements []string, o InstallOptions) error {
	python := o.Python
	if python == "" {
		python = "python3"
	}
	if len(requirements) == 0 {
		res, err := Scan(ctx, dir, ScanOptions{Jobs: 4})
		if err != nil {
			return err
		}
		for _, w := range res {
			requirements = append(requirements, w.Name+"=="+w.Version)
		}
	}
	// --isolated: the node's pip.conf and PIP_* variables must not add an
	// index or other find-links; the wheelhouse is the only source.
	args := []string{"-m", "pip", "--isolated", "install", "--no-index", "--find-links", dir, "--disable-pip-version-check", "--no-input", "--no-cache-dir"}
	if o.Report != "" {
		args = append(args, "--report", o.Report)
	}
	if o.Target != "" {
		args = append(args, "--target", o.Target)
	}
	args = append(args, requirements...)
	cmd := exec.CommandContext(ctx, python, args...)
	cmd.Stdout, cmd.Stderr, cmd.Env = o.Stdout, o.Stderr, o.Env
	// A process pip's build or a package's code left running must not
	// hold the output pipes, and so the cancelled install, open.
	cmd.WaitDelay = probe.WaitDelay
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("pip install --no-index --find-links %s: %w", dir, err)
	}
	return nil
}
