package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// The audit commands sign and verify with sigstore. Its packages (and
// what they pull in: rekor's OpenAPI client, govalidator, rocacheck…)
// cost about 10 ms of package initialisation in every process that links
// them, whatever the command, so they are not linked into gpupass: they
// live in gpupass-audit, the same CLI with the audit commands added, and
// gpupass runs it for `audit` and for the audit CI steps. `gpupass
// validate`, the command every pipeline runs first, starts without them.

// AuditPlugin provides the audit commands.
type AuditPlugin interface {
	// Command returns the `audit` command tree.
	Command(g *GlobalOptions) *cobra.Command
	// CIStep runs the audit or audit-verify CI step (o.Command).
	CIStep(ctx context.Context, o *CIStepOptions, env *ci.Env, out io.Writer) error
	// FieldNames rename the audit library's fields to the flags and the
	// CI inputs that set them (see flagNames).
	FieldNames() (flags, inputs fielderr.Names)
}

// Option configures Main and NewRoot.
type Option func(*rootConfig)

type rootConfig struct {
	audit AuditPlugin
	names fieldNames
	args  []string
	in    io.Reader
	out   io.Writer
	err   io.Writer
}

// WithAudit links the audit commands in (gpupass-audit does).
func WithAudit(p AuditPlugin) Option { return func(c *rootConfig) { c.audit = p } }

const (
	// AuditBinary is the name of the program with the audit commands.
	AuditBinary = "gpupass-audit"
	// AuditBinaryEnv overrides where gpupass looks for it.
	AuditBinaryEnv = "GPUPASS_AUDIT_BIN"
	// forwardedEnv marks a process gpupass started for the audit commands,
	// so that a gpupass-audit that is really gpupass fails instead of
	// starting itself over and over.
	forwardedEnv = "GPUPASS_AUDIT_FORWARDED"
)

// auditForwarder is the AuditPlugin of the gpupass binary: it runs
// gpupass-audit with the same arguments, standard streams and
// environment, and returns its exit code.
type auditForwarder struct{ cfg *rootConfig }

func (f auditForwarder) Command(*GlobalOptions) *cobra.Command {
	return &cobra.Command{
		Use:                "audit",
		Short:              "Build, sign and verify a run's audit report (runs " + AuditBinary + ")",
		DisableFlagParsing: true, // gpupass-audit parses them
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context())
		},
	}
}

// FieldNames: gpupass-audit names its own fields.
func (auditForwarder) FieldNames() (flags, inputs fielderr.Names) { return nil, nil }

func (f auditForwarder) CIStep(ctx context.Context, _ *CIStepOptions, _ *ci.Env, _ io.Writer) error {
	return f.run(ctx)
}

func (f auditForwarder) run(ctx context.Context) error {
	if os.Getenv(forwardedEnv) != "" {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s (from $%s or beside this program) is gpupass without the audit commands: install %s from the same release", AuditBinary, AuditBinaryEnv, AuditBinary)}
	}
	bin, err := findAuditBinary()
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: err}
	}
	cmd := exec.CommandContext(ctx, bin, f.cfg.args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = f.cfg.in, f.cfg.out, f.cfg.err
	cmd.Env = append(os.Environ(), forwardedEnv+"=1")
	// Ctrl-C or a runner's SIGTERM reaches gpupass: pass it on and give
	// the audit the same grace a runner gives gpupass.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 10 * time.Second
	err = cmd.Run()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() >= 0 {
		// It printed its own error; only the exit code is passed on.
		return &ExitError{Code: ee.ExitCode()}
	}
	if err != nil {
		return fmt.Errorf("running %s: %w", bin, err)
	}
	return nil
}

// findAuditBinary looks in $GPUPASS_AUDIT_BIN, beside this program (a
// release archive holds both), then on PATH.
func findAuditBinary() (string, error) {
	if p := os.Getenv(AuditBinaryEnv); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w", AuditBinaryEnv, err)
		}
		return p, nil
	}
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), AuditBinary)
		if st, err := os.Stat(p); err == nil && !st.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(AuditBinary); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("the audit commands are in %s, which is not beside this program, on PATH or in $%s: "+
		"it ships in the same release archive as gpupass; from source: go install github.com/gpupass/gpupass/cmd/%s@<version>", AuditBinary, AuditBinaryEnv, AuditBinary)
}
