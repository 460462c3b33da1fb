package gpupass

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/fsutil"
)

// UpOptions are the flags of `gpupass up`.
type UpOptions struct {
	StateDir        string
	Listen          string
	Regions         []string
	AgentsPerRegion int
	Profile         string
	Python          string
	Demo            bool
	DemoOptions
	Slurm UpSlurm

	Output string
	Log    *slog.Logger
	// Getenv reads the environment (tests inject one).
	Getenv func(string) string
	// Ready, when set, is called with the config once every agent is
	// certified (tests use it instead of parsing output).
	Ready func(*LocalConfig)
}

// AddFlags registers up's flags.
func (o *UpOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.StateDir, "state-dir", "", "state dir: broker database, agent state, logs, config.json (default $XDG_STATE_HOME/gpupass, else .gpupass)")
	f.StringVar(&o.Listen, "listen", "127.0.0.1:7070", "broker address; port 0 picks a free one")
	f.StringSliceVar(&o.Regions, "region", []string{"us-west-2", "eu-central-1"}, "regions to start agents in (repeat or comma-separate)")
	f.IntVar(&o.AgentsPerRegion, "agents-per-region", 1, "agents started per region")
	f.StringVar(&o.Profile, "profile", "a100-80gb-4x", "simulated hardware profile of the agents (built-in name or PROFILE.json)")
	f.StringVar(&o.Python, "python", "/usr/bin/python3", "Python interpreter the agents run jobs with (--demo checks it has torch and the example's pinned packages)")
	f.BoolVar(&o.Demo, "demo", false, "run the example pipeline end to end (validate, train in two regions, compare, audit), then stop")
	o.DemoOptions.AddFlags(cmd)
	o.Slurm.AddFlags(cmd)
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
no --broker-url is given. With a non-default --state-dir, set
GPUPASS_STATE_DIR for those commands. --demo runs the example pipeline.`,
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
	o.AddFlags(cmd)
	return cmd
}

// upStack is the running broker and agents.
type upStack struct {
	dir    string
	broker *child
	agents []*child
	cfg    *LocalConfig
	exited chan *child
}

type child struct {
	name string
	// bin, args and env start it again after a crash.
	bin  string
	args []string
	env  []string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
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
	if len(o.Regions) == 0 {
		return errors.New("--region: give at least one region, e.g. --region us-west-2")
	}
	if o.AgentsPerRegion < 1 || o.AgentsPerRegion > 16 {
		return fmt.Errorf("--agents-per-region %d: must be between 1 and 16", o.AgentsPerRegion)
	}
	if o.Python == "" {
		o.Python = "/usr/bin/python3"
	}
	if err := o.Slurm.validate(o.AgentsPerRegion); err != nil {
		return err
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
	brokerBin, err := findBinary("gpupass-broker")
	if err != nil {
		return err
	}
	agentBin, err := findBinary("gpupass-agent")
	if err != nil {
		return err
	}
	dir, err := filepath.Abs(o.StateDir)
	if err != nil {
		return fmt.Errorf("--state-dir %s: %w", o.StateDir, err)
	}
	for _, d := range []string{dir, filepath.Join(dir, "logs"), filepath.Join(dir, "agents")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return fmt.Errorf("creating state dir: %w", err)
		}
	}
	db := "sqlite://" + filepath.Join(dir, "broker.db")
	toks, err := upTokens(ctx, brokerBin, db, dir)
	if err != nil {
		return err
	}
	addr, err := listenAddr(o.Listen)
	if err != nil {
		return err
	}
	st := &upStack{dir: dir, exited: make(chan *child, 64)}
	defer st.stop(o.Log)

	brokerArgs := []string{"--db", db, "serve", "--listen", addr, "--heartbeat-interval", "2s", "--offline-after", "10s"}
	st.broker, err = st.start("broker", brokerBin, brokerArgs, nil)
	if err != nil {
		return err
	}
	url := "http://" + addr
	if err := waitListening(ctx, addr, st.broker, 20*time.Second); err != nil {
		return err
	}
	st.cfg = &LocalConfig{BrokerURL: url, Token: toks.Submit, Regions: o.Regions, StateDir: dir, BrokerPID: st.broker.cmd.Process.Pid}
	for _, region := range o.Regions {
		for i := 1; i <= o.AgentsPerRegion; i++ {
			name := fmt.Sprintf("agent-%s-%d", region, i)
			args, err := o.agentArgs(url, region, name, filepath.Join(dir, "agents", name))
			if err != nil {
				return err
			}
			c, err := st.start(name, agentBin, args, []string{"GPUPASS_BROKER_TOKEN=" + toks.Agent})
			if err != nil {
				return err
			}
			st.cfg.AgentPIDs = append(st.cfg.AgentPIDs, c.cmd.Process.Pid)
		}
	}
	cfgPath, err := writeLocalConfig(dir, st.cfg)
	if err != nil {
		return err
	}
	nodes, err := waitCertified(ctx, url, toks.Submit, len(o.Regions)*o.AgentsPerRegion, st, 90*time.Second)
	if err != nil {
		return err
	}
	if err := printUp(out, o, st, cfgPath, nodes); err != nil {
		return err
	}
	if o.Ready != nil {
		o.Ready(st.cfg)
	}
	if o.Demo {
		return RunDemo(ctx, &o.DemoOptions, st.cfg, out, o.Log)
	}
	restarts := 0
	for {
		select {
		case <-ctx.Done():
			if o.Output != "json" {
				fmt.Fprintln(out, "stopping…")
			}
			return nil
		case c := <-st.exited:
			if restarts >= 5 {
				return fmt.Errorf("%s exited unexpectedly (%v); see %s", c.name, c.err, c.log)
			}
			if c != st.broker {
				// A crashed agent comes back with its state dir, as a
				// node's service manager would bring it back: it sends
				// what its spool still holds and reports the run it had.
				restarts++
				o.Log.Warn("agent exited; starting it again", "name", c.name, "err", c.err, "log", c.log)
				if o.Output != "json" {
					fmt.Fprintf(out, "%s exited (%v); starting it again\n", c.name, c.err)
				}
				nc, err := st.start(c.name, c.bin, c.args, c.env)
				if err != nil {
					return err
				}
				for i, pid := range st.cfg.AgentPIDs {
					if pid == c.cmd.Process.Pid {
						st.cfg.AgentPIDs[i] = nc.cmd.Process.Pid
					}
				}
				if _, err := writeLocalConfig(dir, st.cfg); err != nil {
					return err
				}
				continue
			}
			// A crashed broker is started again on the same address and
			// database: agents keep their runs going and their records
			// in the spool meanwhile, and nothing is lost.
			restarts++
			o.Log.Warn("broker exited; starting it again", "err", c.err, "log", c.log)
			if o.Output != "json" {
				fmt.Fprintf(out, "broker exited (%v); starting it again\n", c.err)
			}
			if _, err := st.start("broker", brokerBin, brokerArgs, nil); err != nil {
				return err
			}
			if err := waitListening(ctx, addr, st.broker, 20*time.Second); err != nil {
				return err
			}
			st.cfg.BrokerPID = st.broker.cmd.Process.Pid
			if _, err := writeLocalConfig(dir, st.cfg); err != nil {
				return err
			}
		}
	}
}

func printUp(out io.Writer, o *UpOptions, st *upStack, cfgPath string, nodes []*gpupassv1.Node) error {
	if o.Output == "json" {
		type agentJSON struct {
			Node      string  `json:"node"`
			Region    string  `json:"region"`
			Profile   string  `json:"profile"`
			Simulated bool    `json:"simulated"`
			Score     float64 `json:"score"`
		}
		v := struct {
			BrokerURL string      `json:"broker_url"`
			Token     string      `json:"token"`
			Config    string      `json:"config"`
			StateDir  string      `json:"state_dir"`
			Agents    []agentJSON `json:"agents"`
		}{BrokerURL: st.cfg.BrokerURL, Token: st.cfg.Token, Config: cfgPath, StateDir: st.dir}
		for _, n := range nodes {
			v.Agents = append(v.Agents, agentJSON{n.Id, n.Region, n.Profile, n.Simulated, n.GetHealth().GetScore()})
		}
		return json.NewEncoder(out).Encode(v)
	}
	fmt.Fprintf(out, "broker  %s  (SQLite %s, log %s)\n", st.cfg.BrokerURL, filepath.Join(st.dir, "broker.db"), st.broker.log)
	fmt.Fprintf(out, "ui      %s/ui/  (dashboard; log in with the token below)\n", st.cfg.BrokerURL)
	for _, n := range nodes {
		sim := ""
		if n.Simulated {
			sim = `  "simulated": true`
		}
		cert := "certified"
		if !n.ConformancePassed {
			cert = "not certified" // a Slurm node drained or unlike its GRES
		}
		fmt.Fprintf(out, "agent   %-14s %s  %s x%d (%s)  %s, score %s%s\n", n.Region, n.Id, n.Accelerator, n.GpuCount, n.Profile, cert, f2(n.GetHealth().GetScore()), sim)
	}
	fmt.Fprintf(out, "token   %s  (submit; saved in %s)\n", st.cfg.Token, cfgPath)
	if st.dir != mustAbs(DefaultStateDir(o.Getenv)) {
		fmt.Fprintf(out, "        other shells: export GPUPASS_STATE_DIR=%s\n", st.dir)
	}
	if !o.Demo {
		fmt.Fprintln(out, "ready: gpupass train --spec examples/train/gpupass.yaml --region "+strings.Join(o.Regions, " --region ")+" --follow -- /usr/bin/python3 train.py")
		fmt.Fprintln(out, "Ctrl-C stops everything.")
	}
	return nil
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		return p
	}
	return a
}

// findBinary looks next to the running gpupass first (a `make build`
// tree), then on PATH.
func findBinary(name string) (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), name)
		if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("%s not found next to gpupass or on PATH: build it with `go build -o bin/ ./cmd/gpupass ./cmd/gpupass-broker ./cmd/gpupass-agent` (or `make build`) and run bin/gpupass", name)
}

type upTokenFile struct {
	Agent  string `json:"agent"`
	Submit string `json:"submit"`
}

// upTokens returns the stack's agent and submit tokens, creating them on
// first start (the database keeps only their hashes; the state dir keeps
// the secrets, mode 0600, so a restarted `up` keeps its config valid).
func upTokens(ctx context.Context, brokerBin, db, dir string) (*upTokenFile, error) {
	path := filepath.Join(dir, "tokens.json")
	var t upTokenFile
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &t) == nil && t.Agent != "" && t.Submit != "" {
		if _, err := os.Stat(filepath.Join(dir, "broker.db")); err == nil {
			return &t, nil
		}
	}
	create := func(role string) (string, error) {
		var stdout, stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, brokerBin, "--db", db, "--output", "json", "token", "create", "--role", role, "--regions", "*", "--note", "gpupass up")
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			return "", fmt.Errorf("creating the %s token with %s: %v: %s", role, brokerBin, err, strings.TrimSpace(stderr.String()))
		}
		var v struct {
			Token string `json:"token"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &v); err != nil || v.Token == "" {
			return "", fmt.Errorf("creating the %s token: unexpected output from %s token create", role, brokerBin)
		}
		return v.Token, nil
	}
	var err error
	if t.Agent, err = create("agent"); err != nil {
		return nil, err
	}
	if t.Submit, err = create("submit"); err != nil {
		return nil, err
	}
	b, _ := json.Marshal(t)
	// Replaced whole and mode 0600 even over an older file: the tokens
	// are secrets, and a half-written file would strand the new ones,
	// whose hashes are already in the database.
	if err := fsutil.WriteFileAtomic(path, b, 0o600); err != nil {
		return nil, err
	}
	return &t, nil
}

// listenAddr resolves port 0 to a free port now, so the URL is known
// before the broker starts (the agents and the config need it).
func listenAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fmt.Errorf("--listen %q: want HOST:PORT, e.g. 127.0.0.1:7070", listen)
	}
	if port != "0" {
		return listen, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", fmt.Errorf("--listen %s: %w", listen, err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (st *upStack) start(name, bin string, args, env []string) (*child, error) {
	logPath := filepath.Join(st.dir, "logs", name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", logPath, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = upChildAttr()
	if err := cmd.Start(); err != nil {
		lf.Close()
		return nil, fmt.Errorf("starting %s: %w", bin, err)
	}
	c := &child{name: name, bin: bin, args: args, env: env, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		lf.Close()
		close(c.done)
		select {
		case st.exited <- c:
		default:
		}
	}()
	if name == "broker" {
		st.broker = c
	} else {
		for i, a := range st.agents {
			if a.name == name {
				st.agents = append(st.agents[:i:i], st.agents[i+1:]...)
				break
			}
		}
		st.agents = append(st.agents, c)
	}
	return c, nil
}

// stop ends the agents first (they report their runs), then the broker:
// SIGTERM, and SIGKILL after 15 s.
func (st *upStack) stop(log *slog.Logger) {
	term := func(cs []*child) {
		for _, c := range cs {
			select {
			case <-c.done:
				continue
			default:
			}
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
		}
		deadline := time.After(15 * time.Second)
		for _, c := range cs {
			select {
			case <-c.done:
			case <-deadline:
				log.Warn("child did not stop after SIGTERM; killing it", "name", c.name)
				_ = c.cmd.Process.Kill()
				<-c.done
			}
		}
	}
	term(st.agents)
	if st.broker != nil {
		term([]*child{st.broker})
	}
}

func waitListening(ctx context.Context, addr string, c *child, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-c.done:
			return fmt.Errorf("%s exited before listening on %s (%v); see %s", c.name, addr, c.err, c.log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %s; see %s", c.name, addr, limit, c.log)
		}
	}
}

// waitCertified waits until want nodes are online with a passed report.
func waitCertified(ctx context.Context, url, token string, want int, st *upStack, limit time.Duration) ([]*gpupassv1.Node, error) {
	bf := BrokerFlags{URL: url, Token: token}
	cl, err := bf.Dial()
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(limit)
	var last []*gpupassv1.Node
	for {
		resp, err := cl.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
		if err == nil {
			last = resp.Msg.Nodes
			ok := 0
			for _, n := range last {
				if n.Online && n.ConformancePassed {
					ok++
				}
			}
			if ok >= want {
				return last, nil
			}
		}
		select {
		case c := <-st.exited:
			return nil, fmt.Errorf("%s exited during start-up (%v); see %s", c.name, c.err, c.log)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d agents certified within %s; see the logs in %s", len(last), want, limit, filepath.Join(st.dir, "logs"))
		}
	}
}
