// Package localstack is the local stack behind `gpupass up`: a broker
// (SQLite in a state dir) and agents on a simulated hardware profile in
// several regions, run as child processes, supervised (a crashed child is
// started again on the same state) and stopped in order (agents, then the
// broker). It writes the config other commands read to find the broker.
// No cobra, no flag names: bad options are *fielderr.Error naming the
// Options field; printing where the stack is, is the caller's job.
package localstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/fsutil"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/termsafe"
	"github.com/gpupass/gpupass/internal/workdir"
)

// Options describe the stack.
type Options struct {
	// StateDir holds the broker database, agent state, logs and the
	// config (default DefaultStateDir).
	StateDir string
	// Listen is the broker's HOST:PORT; port 0 picks a free one.
	Listen string
	// Regions get AgentsPerRegion agents each (1 to 16).
	Regions         []string
	AgentsPerRegion int
	// Profile is the simulated hardware profile (a built-in name or a
	// PROFILE.json).
	Profile string
	// Python is the interpreter the agents run jobs with.
	Python string
	// Executor is where the agents place runs (the agent's --executor:
	// "local" when empty); AgentArgs are more agent arguments (e.g. the
	// executor's own settings). Both go on every agent's command line.
	Executor  string
	AgentArgs []string
	// ExecutorArgs are the executor's own agent arguments (up's
	// --slurm-*, --kube-* flags as the agent's). Each agent also gets
	// --stack-dir, so an executor that stands for a cluster keeps each
	// region's work apart (agent.Regional); this package names none.
	ExecutorArgs []string
	// BrokerBin and AgentBin are the binaries to run (default: next to
	// the running executable, else on PATH).
	BrokerBin, AgentBin string
	// PublicURL is the broker's --public-url (empty: none).
	PublicURL string
	Log       *slog.Logger
}

// DefaultRegions are the regions `gpupass up` starts agents in without
// --region. The shipped CI examples train in these regions, so they run
// against a stack started as printed; internal/ci holds them to it.
func DefaultRegions() []string { return []string{"us-west-2", "eu-central-1"} }

// Stack is a running local stack.
type Stack struct {
	// Dir is the absolute state dir.
	Dir string
	// Config is what the other commands read; ConfigPath where.
	Config     *Config
	ConfigPath string
	// Nodes are the agents' nodes as the broker certified them.
	Nodes []*gpupassv1.Node
	// BrokerLog is the broker's log file.
	BrokerLog string
	// MetricsURL is the broker's Prometheus endpoint; ReadTokenFile the
	// file holding a read token for every region, which it accepts.
	MetricsURL    string
	ReadTokenFile string

	log        *slog.Logger
	brokerBin  string
	brokerArgs []string
	addr       string
	broker     *child
	agents     []*child
	exited     chan *child
	// lock is the state dir's, held until Stop.
	lock *stateLock
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

// Start starts the broker and the agents and waits until every agent is
// certified. On error, what was started is stopped again.
func Start(ctx context.Context, o Options) (_ *Stack, err error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if o.StateDir == "" {
		o.StateDir = DefaultStateDir(os.Getenv)
	}
	if len(o.Regions) == 0 {
		return nil, &fielderr.Error{Field: "Regions", Problem: "is required: " + "give at least one region, e.g. us-west-2"}
	}
	for _, r := range o.Regions {
		if api.CheckRegion(r) != nil {
			return nil, fielderr.New("Regions", r, "not a region name: use %s", api.RegionRule)
		}
	}
	if o.AgentsPerRegion < 1 || o.AgentsPerRegion > 16 {
		return nil, fielderr.New("AgentsPerRegion", fmt.Sprint(o.AgentsPerRegion), "must be between 1 and 16")
	}
	if o.Python == "" {
		o.Python = probe.DefaultPython
	}
	if o.Listen == "" {
		o.Listen = "127.0.0.1:7070"
	}
	brokerBin, agentBin := o.BrokerBin, o.AgentBin
	if brokerBin == "" {
		if brokerBin, err = findBinary("gpupass-broker"); err != nil {
			return nil, err
		}
	}
	if agentBin == "" {
		if agentBin, err = findBinary("gpupass-agent"); err != nil {
			return nil, err
		}
	}
	if err := checkExecutor(ctx, agentBin, o.Executor); err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(o.StateDir)
	if err != nil {
		return nil, &fielderr.Error{Field: "StateDir", Value: o.StateDir, Err: err}
	}
	for _, d := range []string{dir, filepath.Join(dir, "logs"), filepath.Join(dir, "agents")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, fmt.Errorf("creating state dir: %w", err)
		}
	}
	// One stack per state dir, taken before the tokens or the database
	// are touched; Stop (or the kernel, if up dies) releases it.
	lock, err := lockState(dir)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			lock.release()
		}
	}()
	// The marker keeps the state dir (database, tokens, agents' work
	// dirs) out of every work dir train ships, wherever it lies.
	if err := fsutil.WriteFileAtomic(filepath.Join(dir, workdir.StateMarker), []byte("gpupass state dir: broker database, tokens, agents' state; never shipped in a work dir\n"), 0o600); err != nil {
		return nil, fmt.Errorf("creating state dir: %w", err)
	}
	db := "sqlite://" + filepath.Join(dir, "broker.db")
	toks, err := upTokens(ctx, brokerBin, db, dir)
	if err != nil {
		return nil, err
	}
	addr, err := listenAddr(o.Listen)
	if err != nil {
		return nil, err
	}
	st := &Stack{Dir: dir, log: log, brokerBin: brokerBin, addr: addr, exited: make(chan *child, 64), lock: lock}
	defer func() {
		if err != nil {
			st.Stop()
		}
	}()
	st.brokerArgs = []string{"--db", db, "serve", "--listen", addr, "--heartbeat-interval", "2s", "--offline-after", "10s"}
	if o.PublicURL != "" {
		st.brokerArgs = append(st.brokerArgs, "--public-url", o.PublicURL)
	}
	if _, err = st.start("broker", brokerBin, st.brokerArgs, nil); err != nil {
		return nil, err
	}
	st.BrokerLog = st.broker.log
	url := localURL(addr)
	// A broker on a non-loopback address (--listen 10.0.0.5:7070) is one
	// the user chose to expose (serve warns of it); the stack's own
	// processes reach it on this host and are let through the plain HTTP
	// rule (internal/client) the way --insecure-http would.
	offHost := client.PlainHTTPOffHost(url) != ""
	if err = waitListening(ctx, addr, st.broker, 20*time.Second); err != nil {
		return nil, err
	}
	if err = lock.write(lockInfo{PID: os.Getpid(), URL: url}); err != nil {
		return nil, err
	}
	st.MetricsURL, st.ReadTokenFile = url+"/metrics", filepath.Join(dir, ReadTokenFile)
	st.Config = &Config{BrokerURL: url, Token: toks.Submit, Regions: o.Regions, StateDir: dir, BrokerPID: st.broker.cmd.Process.Pid}
	n := 0
	for _, region := range o.Regions {
		for i := 1; i <= o.AgentsPerRegion; i++ {
			name := fmt.Sprintf("agent-%s-%d", region, i)
			args, err := AgentArgs(o, url, region, name, dir)
			if err != nil {
				return nil, err
			}
			// First: an --agent-arg given to up comes later and wins.
			args = append(JobArgs(o, n), args...)
			n++
			env := []string{"GPUPASS_BROKER_TOKEN=" + toks.Agent}
			if offHost {
				env = append(env, "GPUPASS_INSECURE_HTTP=true")
			}
			c, err := st.start(name, agentBin, args, env)
			if err != nil {
				return nil, err
			}
			st.Config.AgentPIDs = append(st.Config.AgentPIDs, c.cmd.Process.Pid)
		}
	}
	if st.ConfigPath, err = WriteConfig(dir, st.Config); err != nil {
		return nil, err
	}
	if st.Nodes, err = waitCertified(ctx, client.Options{Token: toks.Submit, InsecureHTTP: offHost, UserAgent: buildinfo.UserAgent("gpupass")}, url, len(o.Regions)*o.AgentsPerRegion, st, 90*time.Second); err != nil {
		return nil, err
	}
	return st, nil
}

// AgentArgs is the command line of the agent name in region: the broker,
// its own state dir under dir, the simulated profile (none when Profile
// is empty: a cluster's nodes' own GPUs are measured), the interpreter,
// and the executor with its arguments. An executor that stands for a
// cluster's nodes keeps its provider and hostname labels to itself, and
// places each region's work from --stack-dir (agent.Regional).
func AgentArgs(o Options, brokerURL, region, name, dir string) ([]string, error) {
	args := []string{
		"--broker-url", brokerURL, "--region", region, "--state-dir", filepath.Join(dir, "agents", name),
		"--python", o.Python, "--price-per-hour", "2.5", "--storage-class", "standard", "--bandwidth-gbps", "25",
		"--read-probe-mb", "8",
	}
	if o.Executor != "" {
		args = append(args, "--executor", o.Executor, "--stack-dir", dir)
	}
	if o.Profile != "" {
		args = append(args, "--simulate", o.Profile)
	}
	args = append(args, "--provider", "local", "--zone", region+"a", "--hostname", name, "--query-addr", "127.0.0.1:0")
	return append(append(args, o.ExecutorArgs...), o.AgentArgs...), nil
}

// JobPortsBase and JobPortsEach lay out the job ports of a stack's
// agents: agent n (0, 1, … across regions) gets JobPortsBase+n×JobPortsEach
// and the JobPortsEach after it, so no two of the stack's simulated nodes
// give a gang's rank 0 the same rendezvous port.
const (
	JobPortsBase = 29500
	JobPortsEach = 100
)

// JobArgs are the rendezvous flags of the stack's agent n: loopback (the
// stack's nodes are one machine) and a port range of its own; a Slurm
// agent only the ports (each compute node advertises its NodeAddr). A
// Kubernetes agent's jobs are pods with IPs of their own (rank 0's is
// the rendezvous): the first range, no address. None for another
// executor, which takes no gang rank yet.
func JobArgs(o Options, n int) []string {
	switch o.Executor {
	case "", "local", "slurm":
	case "kubernetes":
		return []string{"--job-ports", fmt.Sprintf("%d-%d", JobPortsBase, JobPortsBase+JobPortsEach-1)}
	default:
		return nil
	}
	lo := JobPortsBase + n*JobPortsEach
	if lo+JobPortsEach-1 > 65535 {
		return nil // a stack of hundreds of agents: the rest take no gang rank
	}
	ports := []string{"--job-ports", fmt.Sprintf("%d-%d", lo, lo+JobPortsEach-1)}
	if o.Executor == "slurm" {
		return ports
	}
	return append([]string{"--job-address", "127.0.0.1"}, ports...)
}

// Restart is a child that exited and was started again.
type Restart struct {
	Name string
	Err  error
	Log  string
}

// MaxRestarts is how many crashes Supervise repairs before it gives up.
const MaxRestarts = 5

// Supervise starts a crashed child again on the same state until ctx
// ends (nil) or a child crashes once too often. restarted, when set,
// hears of each restart.
func (st *Stack) Supervise(ctx context.Context, restarted func(Restart)) error {
	restarts := 0
	for {
		select {
		case <-ctx.Done():
			return nil
		case c := <-st.exited:
			if restarts >= MaxRestarts {
				return fmt.Errorf("%s exited unexpectedly (%v); see %s", c.name, c.err, c.log)
			}
			restarts++
			if restarted != nil {
				restarted(Restart{Name: c.name, Err: c.err, Log: c.log})
			}
			if c != st.broker {
				// A crashed agent comes back with its state dir, as a
				// node's service manager would bring it back: it sends
				// what its spool still holds and reports the run it had.
				st.log.Warn("agent exited; starting it again", "name", c.name, "err", c.err, "log", c.log)
				nc, err := st.start(c.name, c.bin, c.args, c.env)
				if err != nil {
					return err
				}
				for i, pid := range st.Config.AgentPIDs {
					if pid == c.cmd.Process.Pid {
						st.Config.AgentPIDs[i] = nc.cmd.Process.Pid
					}
				}
				if _, err := WriteConfig(st.Dir, st.Config); err != nil {
					return err
				}
				continue
			}
			// A crashed broker is started again on the same address and
			// database: agents keep their runs going and their records
			// in the spool meanwhile, and nothing is lost.
			st.log.Warn("broker exited; starting it again", "err", c.err, "log", c.log)
			if _, err := st.start("broker", st.brokerBin, st.brokerArgs, nil); err != nil {
				return err
			}
			if err := waitListening(ctx, st.addr, st.broker, 20*time.Second); err != nil {
				return err
			}
			st.Config.BrokerPID = st.broker.cmd.Process.Pid
			if _, err := WriteConfig(st.Dir, st.Config); err != nil {
				return err
			}
		}
	}
}

// Stop ends the agents first (they report their runs), then the broker.
func (st *Stack) Stop() { st.stop(st.log) }

// checkExecutor asks the agent which executors it has (gpupass-agent
// executors): an executor added to the agent is one up runs, with its
// settings from the environment (GPUPASS_*, which every agent inherits)
// or AgentArgs, and a name the agent lacks is refused before anything
// starts.
func checkExecutor(ctx context.Context, agentBin, name string) error {
	if name == "" || name == "local" {
		return nil
	}
	out, err := exec.CommandContext(ctx, agentBin, "executors").Output()
	if err != nil {
		return fmt.Errorf("asking the agent for its executors (%s executors): %w", agentBin, err)
	}
	names := strings.Fields(string(out))
	if slices.Contains(names, name) {
		return nil
	}
	return fielderr.New("Executor", name, "%s has no such executor: use one of %s", agentBin, strings.Join(names, ", "))
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
	// Read (role read, every region) scrapes /metrics; it is also kept
	// alone in ReadTokenFile, so a pasted command reads it with
	// $(cat FILE) and up never prints it.
	Read string `json:"read"`
}

// ReadTokenFile is where in the state dir up keeps its read token alone.
const ReadTokenFile = "read.token"

// upTokens returns the stack's agent and submit tokens, creating them on
// first start (the database keeps only their hashes; the state dir keeps
// the secrets, mode 0600, so a restarted `up` keeps its config valid).
func upTokens(ctx context.Context, brokerBin, db, dir string) (*upTokenFile, error) {
	path := filepath.Join(dir, "tokens.json")
	var t upTokenFile
	have := false
	if b, err := os.ReadFile(path); err == nil && json.Unmarshal(b, &t) == nil && t.Agent != "" && t.Submit != "" {
		if _, err := os.Stat(filepath.Join(dir, "broker.db")); err == nil {
			have = true
		}
	}
	if have && t.Read != "" {
		return &t, writeReadToken(dir, t.Read)
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
	if !have {
		if t.Agent, err = create("agent"); err != nil {
			return nil, err
		}
		if t.Submit, err = create("submit"); err != nil {
			return nil, err
		}
	}
	// A state dir from before the read token gets one; its other
	// tokens stay, so its config and agents stay valid.
	if t.Read, err = create("read"); err != nil {
		return nil, err
	}
	b, _ := json.Marshal(t)
	// Replaced whole and mode 0600 even over an older file: the tokens
	// are secrets, and a half-written file would strand the new ones,
	// whose hashes are already in the database.
	if err := fsutil.WriteFileAtomic(path, b, 0o600); err != nil {
		return nil, err
	}
	return &t, writeReadToken(dir, t.Read)
}

// writeReadToken keeps the read token alone in dir/ReadTokenFile, mode
// 0600 like tokens.json.
func writeReadToken(dir, tok string) error {
	return fsutil.WriteFileAtomic(filepath.Join(dir, ReadTokenFile), []byte(tok), 0o600)
}

// localURL is the URL this host's clients reach a broker listening on
// addr by: a wildcard address (0.0.0.0, ::) listens on loopback too, so
// they use loopback, where no token crosses a network.
func localURL(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err == nil {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			loop := "127.0.0.1"
			if ip != nil && ip.To4() == nil {
				loop = "::1"
			}
			addr = net.JoinHostPort(loop, port)
		}
	}
	return "http://" + addr
}

// listenAddr resolves port 0 to a free port now, so the URL is known
// before the broker starts (the agents and the config need it).
func listenAddr(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", fielderr.New("Listen", listen, "want HOST:PORT, e.g. 127.0.0.1:7070")
	}
	if port != "0" {
		return listen, nil
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", &fielderr.Error{Field: "Listen", Value: listen, Err: err}
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (st *Stack) start(name, bin string, args, env []string) (*child, error) {
	logPath := filepath.Join(st.Dir, "logs", name+".log")
	lf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", logPath, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = lf, lf
	cmd.Env = append(os.Environ(), env...)
	cmd.SysProcAttr = childAttr()
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
func (st *Stack) stop(log *slog.Logger) {
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
	st.lock.release()
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
			return fmt.Errorf("%s exited before listening on %s%s (%v); see %s", c.name, addr, lastError(c.log), c.err, c.log)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not listen on %s within %s; see %s", c.name, addr, limit, c.log)
		}
	}
}

// lastError is ": " and the last error line a child wrote to its log
// ("gpupass-agent: --kube-image …": the binaries print their error so as
// they exit), or "" when it wrote none: an agent refuses its executor's
// flags, which up hands it, and up shows why.
func lastError(logPath string) string {
	f, err := os.Open(logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	// The error is the last thing written: the log's tail holds it.
	const tail = 16 << 10
	if st, err := f.Stat(); err == nil && st.Size() > tail {
		_, _ = f.Seek(st.Size()-tail, io.SeekStart)
	}
	b, _ := io.ReadAll(io.LimitReader(f, tail))
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if strings.HasPrefix(lines[i], "gpupass-agent: ") || strings.HasPrefix(lines[i], "gpupass-broker: ") {
			return ": " + termsafe.String(lines[i])
		}
	}
	return ""
}

// waitCertified waits until want nodes are online with a passed report.
func waitCertified(ctx context.Context, co client.Options, url string, want int, st *Stack, limit time.Duration) ([]*gpupassv1.Node, error) {
	cl, err := client.Dial(url, co)
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
			return nil, fmt.Errorf("%s exited during start-up%s (%v); see %s", c.name, lastError(c.log), c.err, c.log)
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("only %d of %d agents certified within %s; see the logs in %s", len(last), want, limit, filepath.Join(st.Dir, "logs"))
		}
	}
}
