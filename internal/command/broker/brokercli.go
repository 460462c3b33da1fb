// Package broker is the command line of gpupass-broker (the daemon is package
// broker at the repository root, imported here as daemon): cobra wiring,
// options structs with AddFlags, and Run functions that do not need cobra.
package broker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	daemon "github.com/gpupass/gpupass/broker"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/broker/store/postgres"
	"github.com/gpupass/gpupass/broker/store/sqlite"
	"github.com/gpupass/gpupass/broker/ui"
	"github.com/gpupass/gpupass/internal/buildinfo"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/command/flagenv"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/exitcode"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/workdir"
)

// DefaultDB is the embedded default store.
const DefaultDB = "sqlite://gpupass-broker.db"

// OpenStore opens the store named by a --db URL: sqlite://PATH (sqlite:///abs/path
// or sqlite://relative/path) or postgres://… / postgresql://….
func OpenStore(ctx context.Context, dbURL string) (store.Store, error) {
	switch {
	case strings.HasPrefix(dbURL, "sqlite://"):
		p := strings.TrimPrefix(dbURL, "sqlite://")
		if p == "" {
			return nil, errors.New("--db sqlite:// needs a file path, e.g. sqlite:///var/lib/gpupass/broker.db")
		}
		return sqlite.Open(ctx, p)
	case strings.HasPrefix(dbURL, "postgres://"), strings.HasPrefix(dbURL, "postgresql://"):
		return postgres.Open(ctx, dbURL)
	}
	return nil, errors.New("--db: want sqlite:///path/to/file.db or postgres://user@host:port/db")
}

type globals struct {
	Output  output.Format
	Verbose bool
	DB      string
}

func (g *globals) logger(w io.Writer) *slog.Logger {
	level := slog.LevelInfo
	if g.Verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: level}))
}

// Main runs gpupass-broker with args and returns the exit code.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := NewCommand()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	if err := root.ExecuteContext(ctx); err != nil {
		fmt.Fprintf(stderr, "gpupass-broker: %v\n", flagNames.Apply(err))
		return exitcode.Of(err)
	}
	return 0
}

// NewCommand builds the gpupass-broker command tree (Main runs it; the
// CLI reference in docs/cli is generated from it).
func NewCommand() *cobra.Command {
	g := &globals{}
	root := &cobra.Command{
		Use:   "gpupass-broker",
		Short: "gpupass control plane: certified-node registry, matching, auth",
		Long: `gpupass-broker keeps the registry of certified GPU nodes: agents enroll,
heartbeat and upload signed conformance reports; clients list nodes and
dry-run specs. One port serves gRPC, gRPC-Web and HTTP/JSON (Connect).

Every flag can be set with GPUPASS_<FLAG> (--db is GPUPASS_DB).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       buildinfo.Get().String(),
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if err := flagenv.Apply(cmd, os.Getenv); err != nil {
				return err
			}
			return output.Check(cmd)
		},
	}
	output.Register(root, &g.Output)
	root.PersistentFlags().BoolVarP(&g.Verbose, "verbose", "v", false, "debug logging")
	root.PersistentFlags().StringVar(&g.DB, "db", DefaultDB, "store: sqlite:///path/file.db or postgres://user@host:port/db")
	root.AddCommand(newServeCmd(g), newTokenCmd(g), newWebhookCmd(g), newWebhooksCmd(g))
	return root
}

// ServeOptions are the flags of `serve`.
type ServeOptions struct {
	DB                string
	Listen            string
	TLSCert, TLSKey   string
	HeartbeatInterval time.Duration
	OfflineAfter      time.Duration
	StartTimeout      time.Duration
	// LeaseTTL is daemon.Config.LeaseTTL (replicas on PostgreSQL).
	LeaseTTL time.Duration
	// Per-run quota (daemon.Config.RunMax*; -1 turns one off).
	RunMaxRecords          int64
	RunMaxLogMB            int64
	RunMaxRecordsPerSecond int
	// MaxTimeLimit is daemon.Config.MaxTimeLimit.
	MaxTimeLimit time.Duration
	// Limits on what clients may hold (daemon.HTTPLimits); sizes as
	// "256MiB".
	MaxBodyMemory, MaxBodyMemoryPerToken, BodyMinRate string
	BodyGrace, IdleTimeout                            time.Duration
	MaxConns, MaxConnsPerIP                           int
	Workdir                                           workdir.Limits
	Metrics                                           MetricsOptions
	// Admission is --admission, parsed by daemon.ParseAdmission.
	Admission string
	// Webhooks is daemon.Config.Webhooks (its flags: --public-url,
	// --webhook-*).
	Webhooks daemon.WebhookConfig
	// Dashboard is daemon.Config.Dashboard.
	Dashboard daemon.DashboardConfig
	Logger    *slog.Logger
	// Ready, when set, receives the listening address once serving.
	Ready func(addr string)
}

// AddFlags registers serve's flags.
func (o *ServeOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Listen, "listen", "127.0.0.1:7070", "address to listen on (host:port)")
	f.StringVar(&o.TLSCert, "tls-cert", "", "TLS certificate (PEM); with --tls-key enables TLS")
	f.StringVar(&o.TLSKey, "tls-key", "", "TLS private key (PEM)")
	f.DurationVar(&o.HeartbeatInterval, "heartbeat-interval", 10*time.Second, "interval agents are told to heartbeat at")
	f.DurationVar(&o.OfflineAfter, "offline-after", 30*time.Second, "mark a node offline after this long without a heartbeat")
	f.DurationVar(&o.StartTimeout, "start-timeout", 2*time.Minute, "end a run left in matched or starting this long without a word from its node")
	f.DurationVar(&o.LeaseTTL, "lease-ttl", daemon.DefaultLeaseTTL, "with several brokers on one PostgreSQL: how long the lease of once-only work (run supervision, offline reports) outlives its holder; a survivor takes it within this plus a third of it")
	f.Int64Var(&o.RunMaxRecords, "run-max-records", daemon.DefaultRunMaxRecords, "records (log events, metric points, checkpoint chunks) one run may store; a run going over is failed with the reason (-1: no limit)")
	f.Int64Var(&o.RunMaxLogMB, "run-max-log-mb", daemon.DefaultRunMaxLogBytes>>20, "MB of log (events and metric points) one run may store; a run going over is failed with the reason; keep it above the agents' --run-log-max-mb (-1: no limit)")
	f.IntVar(&o.RunMaxRecordsPerSecond, "run-max-records-per-second", daemon.DefaultRunMaxRecordsPerSecond, "records per second one run may upload through this broker; faster uploads are told to retry (-1: no limit)")
	f.DurationVar(&o.MaxTimeLimit, "max-time-limit", spec.MaxTimeLimit, "longest wall-clock limit a run may ask for (train --time-limit, the spec's resources.time-limit); longer ones are refused at submit (1s to 720h)")
	f.StringVar(&o.MaxBodyMemory, "max-body-memory", "256MiB", "request body bytes held at once, all calls together; plan about 3x this in memory headroom")
	f.StringVar(&o.MaxBodyMemoryPerToken, "max-body-memory-per-token", "128MiB", "one token's share of --max-body-memory (at least 65MiB: a Submit may carry 64 MiB)")
	f.DurationVar(&o.BodyGrace, "body-grace", 10*time.Second, "time a request body may take before --body-min-rate applies")
	f.StringVar(&o.BodyMinRate, "body-min-rate", "4KiB", "slowest a request body may arrive, per second, after --body-grace; slower calls are ended")
	f.IntVar(&o.MaxConns, "max-conns", 8192, "open connections at most (lowered to what the open-file limit allows); the last eighth is kept for addresses with few connections")
	f.IntVar(&o.MaxConnsPerIP, "max-conns-per-ip", 1024, "open connections from one client address at most")
	f.DurationVar(&o.IdleTimeout, "idle-timeout", 2*time.Minute, "close keep-alive connections idle this long")
	f.IntVar(&o.Workdir.MaxEntries, "workdir-max-entries", workdir.DefaultMaxEntries, "most files and directories a run's work dir archive may hold (checked at submit)")
	f.IntVar(&o.Workdir.MaxDepth, "workdir-max-depth", workdir.DefaultMaxDepth, "most directory levels in a run's work dir archive")
	f.Int64Var(&o.Workdir.MaxBytes, "workdir-max-bytes", workdir.DefaultMaxBytes, "most bytes a run's work dir archive may unpack to")
	f.IntVar(&o.Workdir.MaxPath, "workdir-max-path", workdir.DefaultMaxPath, "longest entry name (bytes) in a run's work dir archive")
	f.StringVar(&o.Admission, "admission", "open", "how regions admit newly enrolled nodes: open (any agent token's node takes runs at once) or approve (a node takes none until an admin runs gpupass nodes approve ID); rules PATTERN=MODE, comma-separated, first match wins, e.g. 'eu-*=approve' or 'approve'; give every replica the same")
	f.IntVar(&o.Dashboard.MaxSessions, "dashboard-max-sessions", ui.DefaultMaxSessions, "dashboard sessions this broker holds at once (in memory, per replica)")
	f.IntVar(&o.Dashboard.AdminReserve, "dashboard-admin-reserve", 0, "of --dashboard-max-sessions, how many only admin tokens may use (0: a tenth; -1: none); an admin login is never refused for want of room")
	f.IntVar(&o.Dashboard.SessionsPerToken, "dashboard-sessions-per-token", ui.DefaultSessionsPerToken, "dashboard sessions one token holds at once; its next login ends its oldest")
	f.IntVar(&o.Dashboard.SessionsPerAddress, "dashboard-sessions-per-address", ui.DefaultSessionsPerAddress, "read and submit sessions from one client address at once; the next login from it ends its oldest")
	f.StringVar(&o.Webhooks.PublicURL, "public-url", "", "where users reach this broker (https://…): webhook events link each run to its dashboard page there")
	f.DurationVar(&o.Webhooks.Timeout, "webhook-timeout", 10*time.Second, "longest one webhook delivery attempt may take, connection to answer")
	f.IntVar(&o.Webhooks.MaxAttempts, "webhook-max-attempts", 10, "attempts of one webhook delivery before it is recorded failed (back-off between them: 10s doubling to 10m)")
	o.Metrics.AddFlags(f)
}

// checkWebhooks refuses webhook settings the broker could not use.
func (o *ServeOptions) checkWebhooks() error {
	if o.Webhooks.Timeout < 0 || o.Webhooks.MaxAttempts < 0 {
		return fmt.Errorf("--webhook-timeout and --webhook-max-attempts must not be negative (0 takes the default)")
	}
	if p := o.Webhooks.PublicURL; p != "" {
		if u, err := url.Parse(p); err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
			return fmt.Errorf("--public-url %q: give the URL users open, e.g. https://gpupass.example.com", p)
		}
	}
	return nil
}

// checkDashboard refuses dashboard limits that leave no room to log in.
func (o *ServeOptions) checkDashboard() error {
	d := o.Dashboard
	for _, f := range []struct {
		flag string
		n    int
	}{{"--dashboard-max-sessions", d.MaxSessions}, {"--dashboard-sessions-per-token", d.SessionsPerToken}, {"--dashboard-sessions-per-address", d.SessionsPerAddress}} {
		if f.n < 1 {
			return fmt.Errorf("%s is %d: give 1 or more", f.flag, f.n)
		}
	}
	if d.AdminReserve >= d.MaxSessions {
		return fmt.Errorf("--dashboard-admin-reserve %d leaves no sessions of --dashboard-max-sessions %d to read and submit tokens: give less than %d", d.AdminReserve, d.MaxSessions, d.MaxSessions)
	}
	return nil
}

// limits parses the limit flags.
func (o *ServeOptions) limits() (daemon.HTTPLimits, error) {
	l := daemon.HTTPLimits{BodyGrace: o.BodyGrace, IdleTimeout: o.IdleTimeout, MaxConns: o.MaxConns, MaxConnsPerIP: o.MaxConnsPerIP}
	for _, f := range []struct {
		flag, val string
		dst       *int64
	}{
		{"--max-body-memory", o.MaxBodyMemory, &l.MaxBodyMemory},
		{"--max-body-memory-per-token", o.MaxBodyMemoryPerToken, &l.MaxBodyMemoryPerToken},
		{"--body-min-rate", o.BodyMinRate, &l.BodyMinRate},
	} {
		if f.val == "" {
			continue
		}
		n, err := spec.ParseSize(f.val)
		if err != nil {
			return l, fmt.Errorf("%s: %w", f.flag, err)
		}
		*f.dst = n
	}
	return l, nil
}

func newServeCmd(g *globals) *cobra.Command {
	o := &ServeOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve the broker API (migrates the store on start; Ctrl-C shuts down gracefully)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.DB = g.DB
			o.Logger = g.logger(cmd.ErrOrStderr())
			return RunServe(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// RunServe serves until ctx is cancelled.
func RunServe(ctx context.Context, o *ServeOptions, out io.Writer) error {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	lim, err := o.limits()
	if err != nil {
		return err
	}
	if o.MaxTimeLimit != 0 && (o.MaxTimeLimit < time.Second || o.MaxTimeLimit > spec.MaxTimeLimit) {
		return fmt.Errorf("--max-time-limit is %s: give 1s to %s", o.MaxTimeLimit, spec.FormatTimeLimit(spec.MaxTimeLimit))
	}
	mc, err := o.Metrics.config()
	if err != nil {
		return err
	}
	if err := o.checkDashboard(); err != nil {
		return err
	}
	if err := o.checkWebhooks(); err != nil {
		return err
	}
	admission, err := daemon.ParseAdmission(o.Admission)
	if err != nil {
		return fmt.Errorf("--admission %w", err)
	}
	s, err := OpenStore(ctx, o.DB)
	if err != nil {
		return err
	}
	defer s.Close()
	ln, err := net.Listen("tcp", o.Listen)
	if err != nil {
		return fmt.Errorf("listening on %s: %w", o.Listen, err)
	}
	if o.RunMaxRecords == 0 || o.RunMaxLogMB == 0 || o.RunMaxRecordsPerSecond == 0 {
		return fmt.Errorf("--run-max-records, --run-max-log-mb and --run-max-records-per-second must be 1 or more (-1: no limit)")
	}
	logBytes := o.RunMaxLogMB << 20
	if o.RunMaxLogMB < 0 {
		logBytes = -1
	}
	b := daemon.New(daemon.Config{Store: s, Logger: o.Logger, HeartbeatInterval: o.HeartbeatInterval, OfflineAfter: o.OfflineAfter, StartTimeout: o.StartTimeout, LeaseTTL: o.LeaseTTL,
		RunMaxRecords: o.RunMaxRecords, RunMaxLogBytes: logBytes, RunMaxRecordsPerSecond: o.RunMaxRecordsPerSecond, MaxTimeLimit: o.MaxTimeLimit, Workdir: o.Workdir, Metrics: mc,
		Admission: admission, Dashboard: o.Dashboard, Webhooks: o.Webhooks})
	scheme := "http"
	if o.TLSCert != "" {
		scheme = "https"
	}
	o.Logger.Info("broker serving", "url", scheme+"://"+ln.Addr().String(), "store", strings.SplitN(o.DB, ":", 2)[0])
	if host, _, _ := net.SplitHostPort(ln.Addr().String()); scheme == "http" && !client.LoopbackHost(host) {
		// Clients refuse such a URL unless told --insecure-http
		// (internal/client), but this is where the choice is made.
		o.Logger.Warn("listening off loopback without TLS: every token clients and agents send crosses the network unencrypted, readable by anyone on the path; give --tls-cert and --tls-key, or --listen 127.0.0.1:PORT behind a TLS-terminating proxy",
			"listen", ln.Addr().String())
	}
	if o.Ready != nil {
		o.Ready(ln.Addr().String())
	}
	err = daemon.Serve(ctx, ln, b, daemon.ServeOptions{TLSCertFile: o.TLSCert, TLSKeyFile: o.TLSKey, Limits: lim})
	if err == nil {
		o.Logger.Info("broker stopped")
	}
	return err
}

// TokenCreateOptions are the flags of `token create`.
type TokenCreateOptions struct {
	DB      string
	Role    string
	Regions string
	Note    string
	Output  output.Format
}

// AddFlags registers token create's flags.
func (o *TokenCreateOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.Role, "role", "", "agent | submit | read | admin (required)")
	f.StringVar(&o.Regions, "regions", "", "region scope, comma-separated glob patterns: 'us-*,eu-central-1' or '*' (required)")
	f.StringVar(&o.Note, "note", "", "a note to recognise the token by (shown by token list)")
}

func newTokenCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke API tokens (stored hashed)"}
	co := &TokenCreateOptions{}
	create := &cobra.Command{
		Use:   "create",
		Short: "Create a token and print it once (stdout); only its hash is stored",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			co.DB, co.Output = g.DB, g.Output
			return RunTokenCreate(cmd.Context(), co, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	co.AddFlags(create)
	list := &cobra.Command{
		Use: "list", Short: "List tokens (ids, roles, scopes; never secrets)", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return RunTokenList(cmd.Context(), g.DB, g.Output, cmd.OutOrStdout())
		},
	}
	revoke := &cobra.Command{
		Use: "revoke TOKEN_ID", Short: "Revoke a token by id (brokers stop accepting it within 10 s)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return RunTokenRevoke(cmd.Context(), g.DB, args[0], cmd.OutOrStdout())
		},
	}
	cmd.AddCommand(create, list, revoke)
	return cmd
}

type tokenJSON struct {
	ID        string    `json:"id"`
	Role      string    `json:"role"`
	Regions   []string  `json:"regions"`
	Note      string    `json:"note,omitempty"`
	CreatedAt time.Time `json:"created_at"`
	Token     string    `json:"token,omitempty"`
}

// RunTokenCreate creates a token; the secret goes to out, once.
func RunTokenCreate(ctx context.Context, o *TokenCreateOptions, out, errw io.Writer) error {
	if o.Role == "" {
		return errors.New("--role is required: agent, submit, read or admin")
	}
	regions, err := daemon.ParseRegions(o.Regions)
	if err != nil {
		return fmt.Errorf("--regions: %w", err)
	}
	s, err := OpenStore(ctx, o.DB)
	if err != nil {
		return err
	}
	defer s.Close()
	secret, t, err := daemon.CreateToken(ctx, s, store.Role(o.Role), regions, o.Note)
	if err != nil {
		return fmt.Errorf("--role: %w", err)
	}
	return output.Write(out, o.Output, tokenCreated{tokenJSON{ID: t.ID, Role: string(t.Role), Regions: t.Regions, Note: t.Note, CreatedAt: t.CreatedAt, Token: secret}, errw})
}

// tokenCreated is what `token create` prints: the secret alone on
// stdout (what goes into a file) and what it is on stderr, or one JSON
// line.
type tokenCreated struct {
	tokenJSON
	errw io.Writer
}

func (t tokenCreated) WriteText(out io.Writer) error {
	fmt.Fprintf(t.errw, "created %s (role %s, regions %s); the token is shown once:\n", t.ID, t.Role, strings.Join(t.Regions, ","))
	_, err := fmt.Fprintln(out, t.Token)
	return err
}

// WriteJSON keeps the one-line document token create has always printed.
func (t tokenCreated) WriteJSON(w io.Writer) error { return output.WriteCompactJSON(w, t.tokenJSON) }

// RunTokenList lists tokens without secrets.
func RunTokenList(ctx context.Context, db string, format output.Format, out io.Writer) error {
	s, err := OpenStore(ctx, db)
	if err != nil {
		return err
	}
	defer s.Close()
	ts, err := s.ListTokens(ctx)
	if err != nil {
		return err
	}
	list := tokenList{}
	for _, t := range ts {
		list = append(list, tokenJSON{ID: t.ID, Role: string(t.Role), Regions: t.Regions, Note: t.Note, CreatedAt: t.CreatedAt})
	}
	return output.Write(out, format, list)
}

// tokenList is what `token list` prints (never a secret).
type tokenList []tokenJSON

func (l tokenList) WriteText(out io.Writer) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tROLE\tREGIONS\tCREATED\tNOTE")
	for _, t := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", t.ID, t.Role, strings.Join(t.Regions, ","), t.CreatedAt.Format(time.RFC3339), t.Note)
	}
	return tw.Flush()
}

// WriteJSON keeps the one-line document token list has always printed.
func (l tokenList) WriteJSON(w io.Writer) error { return output.WriteCompactJSON(w, []tokenJSON(l)) }

// RunTokenRevoke deletes a token.
func RunTokenRevoke(ctx context.Context, db, id string, out io.Writer) error {
	s, err := OpenStore(ctx, db)
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.DeleteToken(ctx, id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("no token %s (see gpupass-broker token list)", id)
		}
		return err
	}
	_, err = fmt.Fprintf(out, "revoked %s\n", id)
	return err
}
