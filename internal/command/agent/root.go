// Package agent is gpupass-agent's command layer: the cobra tree, its
// flags and their environment variables, exit codes and printing. The
// daemon itself (package github.com/gpupass/gpupass/agent) has no cobra.
package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/command/registryflags"
	"github.com/gpupass/gpupass/internal/probe"
)

// Exit codes, the same contract as the gpupass CLI: 0 ok, 1 findings (a
// failed check), 2 usage or I/O error.
const (
	ExitOK       = 0
	ExitFindings = 1
	ExitUsage    = 2
)

type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }

// Main runs gpupass-agent with args and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewCommand(stderr)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	err := root.ExecuteContext(ctx)
	if err == nil {
		return ExitOK
	}
	var ee *exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(stderr, "gpupass-agent: %v\n", allFlagNames().Apply(ee.err))
		}
		return ee.code
	}
	fmt.Fprintf(stderr, "gpupass-agent: %v\n", allFlagNames().Apply(err))
	return ExitUsage
}

// NewCommand builds the gpupass-agent command tree; diagnostics go to
// logw.
func NewCommand(logw io.Writer) *cobra.Command {
	o := &daemon.Options{}
	bs := newBackends()
	reg := &registryflags.Flags{}
	var verbose bool
	var format output.Format
	logger := func() *slog.Logger {
		lvl := slog.LevelInfo
		if verbose {
			lvl = slog.LevelDebug
		}
		return slog.New(slog.NewTextHandler(logw, &slog.HandlerOptions{Level: lvl}))
	}
	root := &cobra.Command{
		Use:   "gpupass-agent",
		Short: "gpupass node daemon: conformance suite, signed runtime fingerprint, broker enrollment",
		Long: `gpupass-agent runs on each GPU node. It creates the node's identity key in
--state-dir on first start, enrolls with the broker using an agent token,
heartbeats, runs the conformance suite at start and every --suite-interval,
and uploads each signed report. A local endpoint (--query-addr, loopback)
answers "what is this node's runtime fingerprint right now":

  curl http://127.0.0.1:7465/v1/fingerprint
  curl --data-binary @gpupass.yaml http://127.0.0.1:7465/v1/fingerprint

Without a GPU the agent says "NVML not available" and offers no GPUs;
--simulate PROFILE runs on a simulated hardware profile, and every report
then says "simulated": true.

Every flag can be set as GPUPASS_<FLAG> (GPUPASS_BROKER_URL,
GPUPASS_BROKER_TOKEN, GPUPASS_BROKER_TOKEN_FILE, …). Exit codes: 0 ok, 1 failed checks (check), 2 usage or I/O.`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Get().String(),
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := applyEnv(cmd, os.Getenv); err != nil {
				return err
			}
			return output.Check(cmd)
		},
		RunE: func(cmd *cobra.Command, _ []string) error {
			bindRegistry(reg, o)
			b, err := backendFor(bs, o.Executor)
			if err != nil {
				return err
			}
			if r, ok := b.(daemon.RootReasoner); ok {
				o.RootReason = r.RootReason()
			}
			if p, ok := b.(daemon.PodRendezvous); ok {
				o.PodJobs = p.PodJobs()
			}
			if err := o.Validate(true); err != nil {
				return err
			}
			if r, ok := b.(daemon.Regional); ok && o.StackDir != "" {
				if err := r.InStack(o.StackDir, o.Region); err != nil {
					return err
				}
			}
			return b.Serve(cmd.Context(), o, logger())
		},
	}
	output.Register(root, &format)
	root.PersistentFlags().BoolVarP(&verbose, "verbose", "v", false, "debug diagnostics on stderr")
	addFlags(root, o, reg, bs)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return err })

	co := &daemon.Options{}
	check := &cobra.Command{
		Use:   "check",
		Short: "Run the conformance suite once and print the signed report (no broker)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := co.Validate(false); err != nil {
				return err
			}
			a, err := daemon.New(co, slog.New(slog.NewTextHandler(io.Discard, nil)))
			if err != nil {
				return err
			}
			sr, err := a.RunOnce(cmd.Context())
			if err != nil {
				return err
			}
			if err := output.Write(cmd.OutOrStdout(), format, checked{sr}); err != nil {
				return err
			}
			if !sr.Report.Passed() {
				return &exitError{code: ExitFindings}
			}
			return nil
		},
	}
	f := check.Flags()
	f.StringVar(&co.StateDir, "state-dir", "/var/lib/gpupass-agent", "directory holding the identity key that signs the report")
	f.StringVar(&co.StorageClass, "storage-class", "standard", "storage class the node is sold as")
	f.StringVar(&co.Region, "region", "", "label: region written in the report")
	addProbeFlags(check, co)
	co.SuiteInterval = 1 << 62 // unused by check, but Validate wants a sane value
	root.AddCommand(check)
	root.AddCommand(factsCommand())
	root.AddCommand(executorsCommand(bs))

	root.AddCommand(&cobra.Command{
		Use:   "profiles",
		Short: "List the built-in simulated hardware profiles",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, n := range probe.ProfileNames() {
				p, err := probe.LoadProfile(n)
				if err != nil {
					return err
				}
				fmt.Fprintf(tw, "%s\t%s\n", n, p.Description)
			}
			return tw.Flush()
		},
	})
	return root
}

// checked is what `check` prints: a table of the checks, or as JSON the
// signed report as it was signed.
type checked struct{ sr *daemon.SignedReport }

func (c checked) WriteJSON(w io.Writer) error {
	b, err := c.sr.MarshalJSON()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}

func (c checked) WriteText(w io.Writer) error {
	r := c.sr.Report
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "STATUS\tCHECK\tEXPECTED\tACTUAL\tMS\tNOTE\n")
	for _, c := range r.Checks {
		note := c.Message
		if c.Cached {
			note = strings.TrimSpace("cached " + note)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%.1f\t%s\n", strings.ToUpper(string(c.Status)), c.Name, dash(c.Expected), c.Actual, c.DurationMS, note)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	verdict := "passed"
	if !r.Passed() {
		verdict = "FAILED"
	}
	fmt.Fprintf(w, "\nsuite %s in %.1f ms; runtime fingerprint %s\n", verdict, r.SuiteDurationMS, r.RuntimeFingerprint)
	if r.Simulated {
		fmt.Fprintf(w, "simulated: true (profile %s): GPU values are not measurements\n", r.Profile)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// applyEnv sets every flag not given on the command line from
// GPUPASS_<FLAG> (and secrets from GPUPASS_<FLAG>_FILE), the rule all
// gpupass binaries share.
func applyEnv(cmd *cobra.Command, getenv func(string) string) error {
	return flagenv.Apply(cmd, getenv)
}
