package gpupass

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/gpupass/gpupass/internal/app/localstack"
	"github.com/gpupass/gpupass/internal/clientconfig"
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// ContextOptions are the flags of `gpupass context set`.
type ContextOptions struct {
	BrokerURL string
	TokenFile string
	TLSCA     string
	StateDir  string

	Output output.Format
	// Getenv reads the environment (tests inject one).
	Getenv func(string) string
}

// AddFlags registers context set's flags.
func (o *ContextOptions) AddFlags(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&o.BrokerURL, "broker-url", "", "the context's broker URL (a comma-separated list for replicas)")
	f.StringVar(&o.TokenFile, "token-file", "", "file holding the context's broker token, one line (the config keeps the path, never the token)")
	f.StringVar(&o.TLSCA, "tls-ca", "", "PEM file of CA certificates to trust for the context's https broker")
	f.StringVar(&o.StateDir, "state-dir", "", "a `gpupass up` stack's state dir instead of --broker-url and --token-file (up registers its own)")
}

func newContextCmd(g *GlobalOptions) *cobra.Command {
	o := &ContextOptions{}
	run := func(f func(*clientconfig.Config, []string, io.Writer) error) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			o.Output, o.Getenv = g.Output, os.Getenv
			cfg, err := loadClientConfig(o.Getenv)
			if err != nil {
				return err
			}
			return f(cfg, args, cmd.OutOrStdout())
		}
	}
	cmd := &cobra.Command{
		Use:   "context",
		Short: "List, pick, add and remove broker contexts (like kubectl config contexts)",
		Long: `A context is a named broker: its URL and the file that holds its token, or
the state dir of a stack that gpupass up started (up registers one, named
after the project's directory). Contexts live in
$XDG_CONFIG_HOME/gpupass/config.yaml (default ~/.config/gpupass/config.yaml,
mode 0600); the file keeps token file paths, never tokens.

Which broker a command talks to, highest first:
  1. --broker-url and --broker-token
  2. GPUPASS_BROKER_URL and GPUPASS_BROKER_TOKEN (or GPUPASS_BROKER_TOKEN_FILE)
  3. --context NAME or GPUPASS_CONTEXT
  4. the stack of the project: .gpupass in the working directory or a parent
     (up to the git root or $HOME), or GPUPASS_STATE_DIR, or $XDG_STATE_HOME/gpupass
  5. the current context (gpupass context use NAME)
A token is only taken from where the broker URL came from.`,
	}
	ls := &cobra.Command{
		Use: "ls", Aliases: []string{"list"}, Short: "List the contexts; * marks the current one",
		Args: cobra.NoArgs, RunE: run(o.list),
	}
	use := &cobra.Command{
		Use: "use NAME", Short: "Make NAME the current context",
		Args: cobra.ExactArgs(1), RunE: run(o.use),
	}
	set := &cobra.Command{
		Use: "set NAME --broker-url URL --token-file FILE", Aliases: []string{"add"},
		Short: "Add a context, or change the one called NAME",
		Args:  cobra.ExactArgs(1), RunE: run(o.set),
	}
	o.AddFlags(set)
	rm := &cobra.Command{
		Use: "rm NAME", Aliases: []string{"delete"}, Short: "Remove a context (its token file stays)",
		Args: cobra.ExactArgs(1), RunE: run(o.rm),
	}
	cmd.AddCommand(ls, use, set, rm)
	return cmd
}

type contextJSON struct {
	Name      string `json:"name"`
	Current   bool   `json:"current"`
	BrokerURL string `json:"broker_url"`
	TokenFile string `json:"token_file,omitempty"`
	StateDir  string `json:"state_dir,omitempty"`
	Problem   string `json:"problem,omitempty"`
}

// describe is what ls shows of x: the broker and where its token is,
// never the token.
func describe(cfg *clientconfig.Config, x *clientconfig.Context) contextJSON {
	v := contextJSON{Name: x.Name, Current: x.Name == cfg.CurrentContext, BrokerURL: x.BrokerURL, TokenFile: cfg.Abs(x.TokenFile)}
	switch {
	case x.StateDir != "":
		v.StateDir = cfg.Abs(x.StateDir)
		c, err := localstack.ReadConfig(v.StateDir)
		switch {
		case err != nil:
			v.Problem = err.Error()
		case c == nil:
			v.Problem = "not up"
		default:
			v.BrokerURL = c.BrokerURL
		}
	case x.TokenFile != "":
		if _, err := cfg.ReadToken(x); err != nil {
			v.Problem = "token file unreadable"
		}
	case x.Token != "":
		v.TokenFile = "(inline in " + cfg.Path + ")"
	}
	return v
}

func (o *ContextOptions) list(cfg *clientconfig.Config, _ []string, out io.Writer) error {
	rows := []contextJSON{}
	for i := range cfg.Contexts {
		rows = append(rows, describe(cfg, &cfg.Contexts[i]))
	}
	return output.Write(out, o.Output, contextList{Config: cfg.Path, Contexts: rows, CurrentContext: cfg.CurrentContext})
}

// contextList is what `context ls` prints (JSON keys in the order they
// have always had).
type contextList struct {
	Config         string        `json:"config"`
	Contexts       []contextJSON `json:"contexts"`
	CurrentContext string        `json:"current_context"`
}

func (l contextList) WriteText(out io.Writer) error {
	rows := l.Contexts
	if len(rows) == 0 {
		_, err := fmt.Fprintf(out, "no contexts in %s: gpupass up registers its stack, gpupass context set NAME --broker-url URL --token-file FILE adds a broker\n", l.Config)
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CURRENT\tNAME\tBROKER\tTOKEN")
	for _, r := range rows {
		cur := ""
		if r.Current {
			cur = "*"
		}
		broker, token := r.BrokerURL, r.TokenFile
		if r.StateDir != "" {
			token = "stack " + r.StateDir
		}
		if broker == "" {
			broker = "-"
		}
		if r.Problem != "" {
			token += " (" + r.Problem + ")"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", cur, r.Name, termsafe.String(broker), termsafe.String(token))
	}
	return tw.Flush()
}

func (o *ContextOptions) use(cfg *clientconfig.Config, args []string, out io.Writer) error {
	x, err := cfg.Lookup(args[0])
	if err != nil {
		return err
	}
	cfg.CurrentContext = x.Name
	if err := cfg.Save(); err != nil {
		return err
	}
	return output.Write(out, o.Output, contextUsed{Config: cfg.Path, CurrentContext: x.Name})
}

// contextUsed is what `context use` prints.
type contextUsed struct {
	Config         string `json:"config"`
	CurrentContext string `json:"current_context"`
}

func (u contextUsed) WriteText(out io.Writer) error {
	_, err := fmt.Fprintf(out, "current context: %s (a project's .gpupass, --context and GPUPASS_* still come first)\n", u.CurrentContext)
	return err
}

func (o *ContextOptions) set(cfg *clientconfig.Config, args []string, out io.Writer) error {
	name := args[0]
	if err := clientconfig.ValidName(name); err != nil {
		return err
	}
	x := clientconfig.Context{Name: name}
	if old, ok := cfg.Get(name); ok {
		x = *old
	}
	abs := func(flag, p string) (string, error) {
		a, err := filepath.Abs(p)
		if err != nil {
			return "", fmt.Errorf("--%s %s: %w", flag, p, err)
		}
		return a, nil
	}
	var err error
	if o.StateDir != "" {
		if o.BrokerURL != "" || o.TokenFile != "" {
			return fmt.Errorf("--state-dir: give either --state-dir or --broker-url with --token-file, not both")
		}
		if x.StateDir, err = abs("state-dir", o.StateDir); err != nil {
			return err
		}
		x.BrokerURL, x.TokenFile, x.Token = "", "", ""
	}
	if o.BrokerURL != "" {
		x.BrokerURL, x.StateDir = o.BrokerURL, ""
	}
	if o.TokenFile != "" {
		if x.TokenFile, err = abs("token-file", o.TokenFile); err != nil {
			return err
		}
		x.Token, x.StateDir = "", ""
	}
	if o.TLSCA != "" {
		if x.TLSCA, err = abs("tls-ca", o.TLSCA); err != nil {
			return err
		}
	}
	if x.StateDir == "" {
		// The fix repeats what was given, so only the missing part is to fill in.
		fix := "gpupass context set " + name + " --broker-url " + termsafe.ShellQuote(x.BrokerURL) + " --token-file " + termsafe.ShellQuote(x.TokenFile)
		if x.BrokerURL == "" {
			fix = strings.Replace(fix, "--broker-url ''", "--broker-url URL", 1)
		}
		if x.TokenFile == "" {
			fix = strings.Replace(fix, "--token-file ''", "--token-file FILE", 1)
		}
		if x.BrokerURL == "" {
			return fmt.Errorf("--broker-url: context %q needs a broker: %s", name, fix)
		}
		if x.TokenFile == "" && x.Token == "" {
			return fmt.Errorf("--token-file: context %q needs the file that holds its token: %s", name, fix)
		}
		if _, err := cfg.ReadToken(&x); err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
	}
	cfg.Set(x)
	first := cfg.CurrentContext == ""
	if first {
		cfg.CurrentContext = name
	}
	if err := cfg.Save(); err != nil {
		return err
	}
	return output.Write(out, o.Output, contextSaved{Config: cfg.Path, Context: describe(cfg, &x), first: first})
}

// contextSaved is what `context set` prints.
type contextSaved struct {
	Config  string      `json:"config"`
	Context contextJSON `json:"context"`
	first   bool        // it became the current context
}

func (s contextSaved) WriteText(out io.Writer) error {
	var err error
	if s.first {
		_, err = fmt.Fprintf(out, "context %s saved in %s (current: it is the first)\n", s.Context.Name, s.Config)
	} else {
		_, err = fmt.Fprintf(out, "context %s saved in %s; use it with: gpupass context use %s\n", s.Context.Name, s.Config, s.Context.Name)
	}
	return err
}

func (o *ContextOptions) rm(cfg *clientconfig.Config, args []string, out io.Writer) error {
	if _, err := cfg.Lookup(args[0]); err != nil {
		return err
	}
	cfg.Remove(args[0])
	if err := cfg.Save(); err != nil {
		return err
	}
	return output.Write(out, o.Output, contextRemoved{Config: cfg.Path, Removed: args[0]})
}

// contextRemoved is what `context rm` prints.
type contextRemoved struct {
	Config  string `json:"config"`
	Removed string `json:"removed"`
}

func (r contextRemoved) WriteText(out io.Writer) error {
	_, err := fmt.Fprintf(out, "context %s removed from %s\n", r.Removed, r.Config)
	return err
}

// stackContext is the context `gpupass up` registered for its stack.
type stackContext struct {
	Name    string `json:"name"`
	Config  string `json:"config"`
	Current bool   `json:"current"`
	// Was is the current context when it is another one (up leaves the
	// user's choice alone).
	Was string `json:"was,omitempty"`
}

// registerStack adds the stack in stateDir to the config file as a
// context: named after the project's directory (the parent of its
// .gpupass), else "local", with -2, -3… when another context has the
// name; the same one again when this stack has one. It becomes current
// only when there is none.
func registerStack(getenv func(string) string, stateDir string) (*stackContext, error) {
	cfg, err := loadClientConfig(getenv)
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	name := ""
	for _, x := range cfg.Contexts {
		if x.StateDir != "" && cfg.Abs(x.StateDir) == dir {
			name = x.Name
			break
		}
	}
	if name == "" {
		base := "local"
		if filepath.Base(dir) == localstack.StateDirName {
			base = clientconfig.SafeName(filepath.Base(filepath.Dir(dir)))
		}
		name = base
		for i := 2; ; i++ {
			if _, taken := cfg.Get(name); !taken {
				break
			}
			name = fmt.Sprintf("%s-%d", base, i)
		}
		cfg.Set(clientconfig.Context{Name: name, StateDir: dir})
	}
	sc := &stackContext{Name: name, Config: cfg.Path}
	switch cfg.CurrentContext {
	case "":
		cfg.CurrentContext = name
		sc.Current = true
	case name:
		sc.Current = true
	default:
		sc.Was = cfg.CurrentContext
	}
	if err := cfg.Save(); err != nil {
		return nil, err
	}
	return sc, nil
}

// line is up's ready line for the context: its name, and how to use it
// from other directories when it is not current.
func (sc *stackContext) line() string {
	if sc.Current {
		return fmt.Sprintf("context %s  (current; saved in %s)", sc.Name, sc.Config)
	}
	return fmt.Sprintf("context %s  (saved in %s; current is %s; from other directories: gpupass context use %s)", sc.Name, sc.Config, sc.Was, sc.Name)
}
