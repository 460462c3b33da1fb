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

	"github.com/gpupass/gpupass/internal/app/compare"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// Some commands are not linked into gpupass: their libraries' package
// initialisation costs every process that links them, whatever the
// command, and `gpupass validate`, the command every pipeline runs first,
// must start fast. They are
//   - audit: sigstore, rekor's OpenAPI client, govalidator… (~10 ms);
//   - bundle: go-containerregistry, docker's credential config;
//   - posting compare reports: go-github, GitLab's client, oauth2.
// They live in gpupass-audit, the same CLI with them linked in, and
// gpupass runs it, with the same arguments, streams and environment, for
// `audit`, `bundle`, a `compare` that posts, and their CI steps.

// Plugin provides a command tree that gpupass does not link, and its CI
// steps.
type Plugin interface {
	// Command returns the command tree (`audit`, `bundle`).
	Command(g *GlobalOptions) *cobra.Command
	// CIStep runs one of its CI steps (o.Command).
	CIStep(ctx context.Context, o *CIStepOptions, env *ci.Env, out io.Writer) error
	// FieldNames rename its libraries' fields to the flags and the CI
	// inputs that set them (see flagNames).
	FieldNames() (flags, inputs fielderr.Names)
}

// Option configures Main and NewRoot.
type Option func(*rootConfig)

type rootConfig struct {
	audit  Plugin
	bundle Plugin
	poster compare.Poster // nil: a compare that posts runs gpupass-audit
	names  fieldNames
	args   []string
	in     io.Reader
	out    io.Writer
	err    io.Writer
}

// WithAudit links the audit commands in (gpupass-audit does).
func WithAudit(p Plugin) Option { return func(c *rootConfig) { c.audit = p } }

// WithBundle links the bundle commands in (gpupass-audit does).
func WithBundle(p Plugin) Option { return func(c *rootConfig) { c.bundle = p } }

// WithPoster links posting compare reports to the forges in
// (gpupass-audit does).
func WithPoster(p compare.Poster) Option { return func(c *rootConfig) { c.poster = p } }

const (
	// AuditBinary is the name of the program with every command linked
	// in (it was first made for the audit commands).
	AuditBinary = "gpupass-audit"
	// AuditBinaryEnv overrides where gpupass looks for it.
	AuditBinaryEnv = "GPUPASS_AUDIT_BIN"
	// forwardedEnv marks a process gpupass started for the audit commands,
	// so that a gpupass-audit that is really gpupass fails instead of
	// starting itself over and over.
	forwardedEnv = "GPUPASS_AUDIT_FORWARDED"
)

// forwarder is the Plugin of the gpupass binary for a command set it
// does not link: it runs gpupass-audit with the same arguments, standard
// streams and environment, and returns its exit code.
type forwarder struct {
	cfg   *rootConfig
	use   string // the command tree's name
	short string
	what  string // what needs gpupass-audit, for errors
}

var (
	auditCommands  = forwarder{use: "audit", short: "Build, sign and verify a run's audit report", what: "the audit commands are"}
	bundleCommands = forwarder{use: "bundle", short: "Move wheelhouses in and out of OCI registries, verified, for nodes without internet", what: "the bundle commands are"}
	comparePosting = forwarder{what: "posting the compare report to GitHub or GitLab is"}
)

// with is f forwarding cfg's arguments and streams.
func (f forwarder) with(cfg *rootConfig) forwarder { f.cfg = cfg; return f }

func (f forwarder) Command(*GlobalOptions) *cobra.Command {
	return &cobra.Command{
		Use:                f.use,
		Short:              f.short + " (runs " + AuditBinary + ")",
		DisableFlagParsing: true, // gpupass-audit parses them
		RunE: func(cmd *cobra.Command, _ []string) error {
			return f.run(cmd.Context())
		},
	}
}

// FieldNames: gpupass-audit names its own fields.
func (forwarder) FieldNames() (flags, inputs fielderr.Names) { return nil, nil }

func (f forwarder) CIStep(ctx context.Context, _ *CIStepOptions, _ *ci.Env, _ io.Writer) error {
	return f.run(ctx)
}

func (f forwarder) run(ctx context.Context) error {
	if os.Getenv(forwardedEnv) != "" {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s (from $%s or beside this program) is gpupass without the audit, bundle and forge commands: install %s from the same release", AuditBinary, AuditBinaryEnv, AuditBinary)}
	}
	bin, err := findAuditBinary()
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("%s in %s: %w", f.what, AuditBinary, err)}
	}
	cmd := exec.CommandContext(ctx, bin, f.cfg.args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = f.cfg.in, f.cfg.out, f.cfg.err
	cmd.Env = append(os.Environ(), forwardedEnv+"=1")
	// Ctrl-C or a runner's SIGTERM reaches gpupass: pass it on and give
	// the command the same grace a runner gives gpupass.
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
	return "", fmt.Errorf("it is not beside this program, on PATH or in $%s: "+
		"it ships in the same release archive as gpupass; from source: go install github.com/gpupass/gpupass/cmd/%s@<version>", AuditBinaryEnv, AuditBinary)
}
