package gpupass

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/gpupass/gpupass/internal/command/executorflags"
)

// UpExecutor is up's --executor and the flags of every executor the
// agent has, registered from the list gpupass embeds (executorflags):
// gpupass links no executor. The flags the user sets go to each region's
// agent as its own, whose backend checks them as it does any agent's
// (agent.Regional.InStack, then Serve; up shows its error). Up checks
// only what is the stack's: a flag of another executor, and one agent
// per region for an executor that stands for a whole cluster.
type UpExecutor struct {
	// Name is --executor.
	Name string

	executors []executorflags.Executor
	flags     *pflag.FlagSet
	// err is a list gpupass cannot hold (a flag type it does not know),
	// refused when up runs rather than in every command's start.
	err error
}

// AddFlags registers --executor and the flags of es (nil: the list
// gpupass was built with), each executor's flags in a group of their own
// in up's help.
func (x *UpExecutor) AddFlags(cmd *cobra.Command, es []executorflags.Executor) {
	if es == nil {
		es, x.err = executorflags.Registered()
	}
	x.executors, x.flags = es, cmd.Flags()
	var kinds []string
	for _, e := range es {
		kinds = append(kinds, e.Name+" ("+e.Usage+")")
		if err := e.AddFlags(x.flags); err != nil {
			if x.err == nil {
				x.err = err
			}
			continue
		}
		for _, fl := range e.Flags {
			if f := x.flags.Lookup(fl.Name); f != nil {
				_ = x.flags.SetAnnotation(fl.Name, groupAnnotation, []string{e.Name})
			}
		}
	}
	x.flags.StringVar(&x.Name, "executor", "local", "how the agents run jobs: "+strings.Join(kinds, ", ")+"; or another executor the agent has (gpupass-agent executors lists them; its settings from GPUPASS_* in the environment)")
	cmd.SetUsageTemplate(strings.Replace(cmd.UsageTemplate(), "{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}", "{{upFlagUsages .}}", 1))
}

// groupAnnotation marks a flag of up's with the executor it belongs to.
const groupAnnotation = "gpupass-executor"

func init() { cobra.AddTemplateFunc("upFlagUsages", upFlagUsages) }

// upFlagUsages is the flags part of up's help: up's own flags, then each
// executor's under a heading of its own.
func upFlagUsages(cmd *cobra.Command) string {
	own := pflag.NewFlagSet("up", pflag.ContinueOnError)
	groups := map[string]*pflag.FlagSet{}
	var order []string
	cmd.LocalFlags().VisitAll(func(f *pflag.Flag) {
		g := f.Annotations[groupAnnotation]
		if len(g) == 0 {
			own.AddFlag(f)
			return
		}
		if groups[g[0]] == nil {
			groups[g[0]] = pflag.NewFlagSet(g[0], pflag.ContinueOnError)
			order = append(order, g[0])
		}
		groups[g[0]].AddFlag(f)
	})
	var b strings.Builder
	b.WriteString(strings.TrimRight(own.FlagUsages(), " \n"))
	for _, name := range order {
		fmt.Fprintf(&b, "\n\nFlags of --executor %s (gpupass-agent's own, passed to each region's agent):\n%s", name, strings.TrimRight(groups[name].FlagUsages(), " \n"))
	}
	return b.String()
}

// executor is the chosen executor's entry, nil for one the list lacks
// (another executor the agent has).
func (x *UpExecutor) executor() *executorflags.Executor {
	name := x.Name
	if name == "" {
		name = "local"
	}
	for i := range x.executors {
		if x.executors[i].Name == name {
			return &x.executors[i]
		}
	}
	return nil
}

// validate refuses a flag of an executor other than --executor given on
// the command line (one from the environment may be another stack's),
// and more than one agent per region where one agent stands for a whole
// cluster.
func (x *UpExecutor) validate(agentsPerRegion int, getenv func(string) string) error {
	if x.err != nil {
		return x.err
	}
	sel := x.executor()
	for _, e := range x.executors {
		if sel != nil && e.Name == sel.Name {
			continue
		}
		var set []string
		for _, fl := range e.Flags {
			if x.flags != nil && x.flags.Changed(fl.Name) && getenv(fl.Env) == "" {
				set = append(set, "--"+fl.Name)
			}
		}
		switch len(set) {
		case 0:
		case 1:
			return fmt.Errorf("%s needs --executor %s", set[0], e.Name)
		default:
			return fmt.Errorf("%s need --executor %s", strings.Join(set, ", "), e.Name)
		}
	}
	if sel != nil && sel.StandsFor != "" && agentsPerRegion != 1 {
		return fmt.Errorf("--agents-per-region %d: with --executor %s each region has one agent, which stands for %s", agentsPerRegion, sel.Name, sel.StandsFor)
	}
	return nil
}

// args are the chosen executor's flags as the agents' arguments.
func (x *UpExecutor) args() []string {
	if sel := x.executor(); sel != nil && x.flags != nil {
		return sel.Args(x.flags)
	}
	return nil
}
