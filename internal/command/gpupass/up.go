package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/command/executorflags"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// UpOptions are the flags of `gpupass up`.
type UpOptions struct {
	StateDir        string
	Listen          string
	Regions         []string
	AgentsPerRegion int
	Profile         string
	Python          string
	// PublicURL is where users reach the dashboard: the broker's
	// --public-url (empty: none).
	PublicURL string
	Demo      bool
	DemoOptions
	Executor UpExecutor

	Output output.Format
	Log    *slog.Logger
	// Getenv reads the environment (tests inject one).
	Getenv func(string) string
	// Ready, when set, is called with the config once every agent is
	// certified (tests use it instead of parsing output).
	Ready func(*LocalConfig)
}

// AddFlags registers up's flags, with the executors' flags of the list
// gpupass was built with.
func (o *UpOptions) AddFlags(cmd *cobra.Command) { o.addFlags(cmd, nil) }

func (o *UpOptions) addFlags(cmd *cobra.Command, executors []executorflags.Executor) {
	f := cmd.Flags()
	f.StringVar(&o.StateDir, "state-dir", "", "state dir: broker database, agent state, logs, config.json (default $XDG_STATE_HOME/gpupass, else the project's .gpupass: found from here up, else beside the nearest gpupass.yaml, else in the working directory)")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:7070", "broker address; port 0 picks a free one")
	f.StringSliceVar(&o.Regions, "region", localstack.DefaultRegions(), "regions to start agents in (repeat or comma-separate)")
	f.IntVar(&o.AgentsPerRegion, "agents-per-region", 1, "agents started per region")
	f.StringVar(&o.Profile, "profile", "a100-80gb-4x", "simulated hardware profile of the agents (built-in name or PROFILE.json)")
	f.StringVar(&o.Python, "python", probe.DefaultPython, "Python interpreter the agents run jobs with (--demo checks it has torch and the example's pinned packages)")
	f.StringVar(&o.PublicURL, "public-url", "", "where users reach the broker's dashboard (https://…), when not at the local URL: run pages in webhook events and compare's report link there (gpupass-broker serve --public-url)")
	f.BoolVar(&o.Demo, "demo", false, "run the example pipeline end to end (validate, train in two regions, compare, audit), then stop")
	o.DemoOptions.AddFlags(cmd)
	o.Executor.AddFlags(cmd, executors)
}

func newUpCmd(g *GlobalOptions) *cobra.Command {
	o := &UpOptions{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start a local broker and agents on simulated GPUs in several regions (Ctrl-C stops them)",
		Long: `up starts gpupass-broker (SQLite in the state dir) and one gpupass-agent per
region on a simulated hardware profile, as child processes. The binaries are
taken from next to gpupass, else from PATH; build them with

  go build -o bin/ ./cmd/gpupass ./cmd/gpupass-broker ./cmd/gpupass-agent

It prints the broker URL and a submit token and writes both to
STATE_DIR/config.json, which train, logs, runs, cancel and nodes read when
no --broker-url is given, from the project's directory or any directory
below it. It also saves the stack as a context (gpupass context ls), named
after the project's directory: gpupass context use NAME reaches it from
anywhere. --demo runs the example pipeline.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.Output, o.Log, o.Getenv = g.Output, g.Logger(cmd.ErrOrStderr()), os.Getenv
			if o.Demo && !cmd.Flags().Changed("listen") && os.Getenv(EnvName("listen")) == "" {
				// The demo stops its stack when done: any free port will
				// do, and a busy 7070 must not fail it.
				o.Listen = "127.0.0.1:0"
			}
			return RunUp(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.addFlags(cmd, g.Executors)
	return cmd
}

// upFlagNames maps the local stack's option fields to up's flags.
var upFlagNames = fielderr.Names{
	"Regions": "--region", "AgentsPerRegion": "--agents-per-region", "StateDir": "--state-dir", "Listen": "--listen",
	"Executor": "--executor",
}

// RunUp starts the stack, prints where it is, and serves until ctx ends
// (or, with --demo, until the demo ends), then stops every child.
func RunUp(ctx context.Context, o *UpOptions, out io.Writer) error {
	if o.Getenv == nil {
		o.Getenv = os.Getenv
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir(o.Getenv)
	}
	if o.Python == "" {
		o.Python = probe.DefaultPython
	}
	if err := o.Executor.validate(o.AgentsPerRegion, o.Getenv); err != nil {
		return err
	}
	if p := o.PublicURL; p != "" {
		if u, err := url.Parse(p); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return &ExitError{Code: ExitUsage, Err: fmt.Errorf("up: --public-url %q: give the URL users open the dashboard at, e.g. https://gpupass.example.com", p)}
		}
	}
	if o.Demo {
		// The demo's jobs run with the agents' interpreter; check it can
		// run them before anything starts.
		if o.DemoOptions.Python == "" {
			o.DemoOptions.Python = o.Python
		}
		if err := CheckDemoPython(ctx, o.DemoOptions.Python, o.ExampleDir); err != nil {
			return err
		}
	}
	st, err := localstack.Start(ctx, localstack.Options{
		StateDir: o.StateDir, Listen: o.Listen, Regions: o.Regions, AgentsPerRegion: o.AgentsPerRegion,
		Profile: o.Profile, Python: o.Python, Log: o.Log, PublicURL: o.PublicURL,
		Executor: o.Executor.Name, ExecutorArgs: o.Executor.args(),
	})
	if re := (*localstack.RunningError)(nil); errors.As(err, &re) {
		return upRunningError(re)
	}
	if err != nil {
		return upFlagNames.Apply(err)
	}
	defer st.Stop()
	if err := printUp(out, o, st); err != nil {
		return err
	}
	if o.Ready != nil {
		o.Ready(st.Config)
	}
	if o.Demo {
		return RunDemo(ctx, &o.DemoOptions, st.Config, out, o.Log)
	}
	err = st.Supervise(ctx, func(r localstack.Restart) {
		if o.Output != output.JSON {
			fmt.Fprintf(out, "%s exited (%v); starting it again\n", r.Name, r.Err)
		}
	})
	if err == nil && o.Output != output.JSON {
		fmt.Fprintln(out, "stopping…")
	}
	return err
}

// upRunningError says which stack holds the state dir and how to stop
// it or start a second one; each command in it runs as pasted.
func upRunningError(re *localstack.RunningError) error {
	pid, url, stop := "unknown", re.URL, "Ctrl-C in its terminal"
	if re.PID > 0 {
		pid = strconv.Itoa(re.PID)
		stop += " or `kill " + pid + "`"
	}
	if url == "" {
		url = "not listening yet"
	}
	return &ExitError{Code: ExitUsage, Err: fmt.Errorf("a stack is already running here (pid %s, URL %s, state dir %s): stop it with %s, or start another with `gpupass up --state-dir %s --listen 127.0.0.1:0`",
		pid, url, termsafe.ShellQuote(re.Dir), stop, termsafe.ShellQuote(re.Other))}
}

func printUp(out io.Writer, o *UpOptions, st *localstack.Stack) error {
	// A demo's stack is gone when it ends: it gets no context.
	var sc *stackContext
	if !o.Demo {
		var err error
		if sc, err = registerStack(o.Getenv, st.Dir); err != nil {
			o.Log.Warn("the stack is not saved as a context; other directories need GPUPASS_STATE_DIR", "err", err)
		}
	}
	v := upResult{BrokerURL: st.Config.BrokerURL, Token: st.Config.Token, Config: st.ConfigPath, StateDir: st.Dir, Metrics: st.MetricsURL, ReadToken: st.ReadTokenFile, Context: sc, o: o, st: st}
	for _, n := range st.Nodes {
		v.Agents = append(v.Agents, upAgent{n.Id, n.Region, n.Profile, n.Simulated, n.GetHealth().GetScore()})
	}
	return output.Write(out, o.Output, v)
}

// upResult is what up prints once its stack is ready.
type upResult struct {
	BrokerURL string        `json:"broker_url"`
	Token     string        `json:"token"`
	Config    string        `json:"config"`
	StateDir  string        `json:"state_dir"`
	Metrics   string        `json:"metrics_url,omitempty"`
	ReadToken string        `json:"read_token_file,omitempty"`
	Context   *stackContext `json:"context,omitempty"`
	Agents    []upAgent     `json:"agents"`

	o  *UpOptions
	st *localstack.Stack
}

type upAgent struct {
	Node      string  `json:"node"`
	Region    string  `json:"region"`
	Profile   string  `json:"profile"`
	Simulated bool    `json:"simulated"`
	Score     float64 `json:"score"`
}

// WriteJSON keeps the one-line document up has always printed.
func (v upResult) WriteJSON(w io.Writer) error { return output.WriteCompactJSON(w, v) }

func (v upResult) WriteText(out io.Writer) error {
	o, st, sc := v.o, v.st, v.Context
	fmt.Fprintf(out, "broker  %s  (SQLite %s, log %s)\n", st.Config.BrokerURL, filepath.Join(st.Dir, "broker.db"), st.BrokerLog)
	fmt.Fprintf(out, "ui      %s/ui/  (dashboard; log in with the token below)\n", st.Config.BrokerURL)
	for _, n := range st.Nodes {
		sim := ""
		if n.Simulated {
			sim = `  "simulated": true`
		}
		cert := "certified"
		if !n.ConformancePassed {
			cert = "not certified" // a Slurm node drained or unlike its GRES, a cordoned Kubernetes node
		}
		fmt.Fprintf(out, "agent   %-14s %s  %s x%d (%s)  %s, score %s%s\n", n.Region, n.Id, n.Accelerator, n.GpuCount, n.Profile, cert, f2(n.GetHealth().GetScore()), sim)
	}
	fmt.Fprintf(out, "token   %s  (submit; saved in %s)\n", st.Config.Token, st.ConfigPath)
	if st.MetricsURL != "" {
		// The read token stays in its file: the line is pasted, not the secret.
		fmt.Fprintf(out, "metrics %s  (Prometheus text; the read token is in %s)\n", metricsCurl(st.MetricsURL, st.ReadTokenFile), st.ReadTokenFile)
	}
	cwd, err := os.Getwd()
	if err != nil {
		cwd = "."
	}
	if st.Dir != stateDirFrom(o.Getenv, cwd) {
		fmt.Fprintf(out, "        other shells: export GPUPASS_STATE_DIR=%s\n", termsafe.ShellQuote(st.Dir))
	}
	if sc != nil {
		fmt.Fprintln(out, sc.line())
	}
	// A broker on an address off loopback (--listen 10.0.0.5:7070) is
	// refused the token without consent (internal/client): the ready
	// line carries it, and the other commands are told how.
	insecure := stackOffLoopback(st.Config)
	if insecure {
		fmt.Fprintf(out, "        plain HTTP off loopback: other broker commands need --insecure-http, or: export %s=true\n", EnvName("insecure-http"))
	}
	if !o.Demo {
		fmt.Fprintln(out, "ready: "+readyCommand(o, cwd, st.Dir, insecure))
		fmt.Fprintln(out, "Ctrl-C stops everything.")
	}
	return nil
}

// metricsCurl is the command that scrapes the stack's /metrics with the
// read token read from its file when pasted.
func metricsCurl(url, tokenFile string) string {
	return fmt.Sprintf(`curl -H "Authorization: Bearer $(cat %s)" %s`, termsafe.ShellQuote(tokenFile), url)
}

// readyCommand is the train command up prints, one that runs as pasted
// in cwd, the directory up runs in, against the stack in stateDir: the
// project's spec and train.py when they are there (a project from
// `gpupass init`) or in the project's root above cwd (the parent of a
// .gpupass stateDir), else the repository's example, else init first.
// The spec's directory is the run's work dir, so train.py reaches the
// nodes. Where commands in cwd would find another stack (--state-dir
// elsewhere), the command names this one's state dir. insecure adds the
// consent a broker off loopback needs.
func readyCommand(o *UpOptions, cwd, stateDir string, insecure bool) string {
	cwd, stateDir = mustAbs(cwd), mustAbs(stateDir)
	dirs := []string{"."}
	if filepath.Base(stateDir) == localstack.StateDirName {
		if rel, err := filepath.Rel(cwd, filepath.Dir(stateDir)); err == nil && onlyParents(rel) {
			dirs = append(dirs, rel) // cwd is below the project's root
		}
	}
	dirs = append(dirs, filepath.Join("examples", "train"))
	spec := "gpupass.yaml"
	init := "gpupass init && "
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(cwd, d, "train.py")); err != nil {
			continue
		}
		if _, err := os.Stat(filepath.Join(cwd, d, "gpupass.yaml")); err == nil {
			spec, init = filepath.Join(d, "gpupass.yaml"), ""
			break
		}
	}
	var b strings.Builder
	b.WriteString(init)
	if stateDirFrom(o.Getenv, cwd) != stateDir {
		b.WriteString(EnvName("state-dir") + "=" + termsafe.ShellQuote(stateDir) + " ")
	}
	b.WriteString("gpupass train --spec " + termsafe.ShellQuote(spec))
	for _, r := range o.Regions {
		b.WriteString(" --region " + termsafe.ShellQuote(r))
	}
	if insecure {
		b.WriteString(" --insecure-http")
	}
	b.WriteString(" --follow -- " + termsafe.ShellQuote(o.Python) + " train.py")
	return b.String()
}

// stateDirFrom is the absolute state dir whose stack commands run in
// cwd find (DefaultStateDir there).
func stateDirFrom(getenv func(string) string, cwd string) string {
	d := localstack.StateDirFrom(getenv, cwd)
	if !filepath.IsAbs(d) {
		d = filepath.Join(mustAbs(cwd), d)
	}
	return filepath.Clean(d)
}

// onlyParents reports whether rel is "..", "../..", …: a directory above.
func onlyParents(rel string) bool {
	for _, p := range strings.Split(rel, string(filepath.Separator)) {
		if p != ".." {
			return false
		}
	}
	return true
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}
