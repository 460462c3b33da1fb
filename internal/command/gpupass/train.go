package gpupass

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
	"github.com/gpupass/gpupass/internal/workdir"
)

// TrainOptions are the flags of `gpupass train`.
type TrainOptions struct {
	Global          *GlobalOptions
	Broker          BrokerFlags
	Spec            string
	Regions         []string
	Name            string
	Follow          bool
	MaxPrice        float64
	MaxRestarts     int
	ResumeElsewhere bool
	MinHealthScore  float64
	Workdir         string
	WorkdirLimits   workdir.Limits
	// Command is what runs on each node (after --).
	Command []string
	// Getenv reads CI variables for the run name (os.Getenv by default).
	Getenv func(string) string
	// Observe, when set, sees the runs once submitted (also when a later
	// region's submit fails) and again once they ended: the CI step hands
	// their allocation ids to later jobs even when a run fails.
	Observe func(runs []*gpupassv1.Run)
}

// AddFlags registers train's flags.
func (o *TrainOptions) AddFlags(cmd *cobra.Command) {
	o.Broker.AddFlags(cmd)
	f := cmd.Flags()
	f.StringVarP(&o.Spec, "spec", "s", "gpupass.yaml", "the run's spec file")
	f.StringArrayVar(&o.Regions, "region", nil, "region to train in; repeat for one run per region (required)")
	f.StringVar(&o.Name, "name", "", "run name (default: the spec's name); the region and, in CI, the short commit are added")
	f.BoolVarP(&o.Follow, "follow", "f", false, "stream the logs of every run (prefixed by region) and exit with the worst result")
	f.Float64Var(&o.MaxPrice, "max-price", 0, "highest node price in USD per hour (0 = no limit)")
	f.IntVar(&o.MaxRestarts, "max-restarts", 3, "restarts after a NaN/Inf loss, from the newest checkpoint")
	f.BoolVar(&o.ResumeElsewhere, "resume-elsewhere", false, "when a node is lost mid-run, restart on another candidate from the newest checkpoint instead of failing")
	f.Float64Var(&o.MinHealthScore, "min-health-score", api.DefaultMinHealthScore, "lowest node health score to place on")
	f.StringVar(&o.Workdir, "workdir", "", "directory shipped to each node as the command's work dir (at most 64 MiB compressed)")
	f.IntVar(&o.WorkdirLimits.MaxEntries, "workdir-max-entries", workdir.DefaultMaxEntries, "most files and directories --workdir may hold (the broker checks its own limit)")
	f.IntVar(&o.WorkdirLimits.MaxDepth, "workdir-max-depth", workdir.DefaultMaxDepth, "most directory levels in --workdir")
	f.Int64Var(&o.WorkdirLimits.MaxBytes, "workdir-max-bytes", workdir.DefaultMaxBytes, "most bytes of files in --workdir")
	f.IntVar(&o.WorkdirLimits.MaxPath, "workdir-max-path", workdir.DefaultMaxPath, "longest path (bytes) under --workdir")
}

func newTrainCmd(g *GlobalOptions) *cobra.Command {
	o := &TrainOptions{Global: g}
	cmd := &cobra.Command{
		Use:   "train --spec FILE --region R [--region R2 …] [flags] -- COMMAND [ARG…]",
		Short: "Run the training command on certified nodes, one run per region",
		Long: `Submit one run per --region to the broker. Each is placed on the best certified
node of its region (the order of validate --dry-run) and printed with its
allocation id, node and health score. With --follow, the logs of all runs are
streamed, each line prefixed by its region, and the exit code is the worst
result: 0 all succeeded, 1 any failed or was cancelled, 2 bad input.`,
		Example: `  gpupass train --spec gpupass.yaml --region us-west-2 --region eu-central-1 --follow -- python3 train.py
  gpupass train --region us-west-2 --max-price 30 --workdir . -- python3 train.py --epochs 3`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.ArgsLenAtDash() < 0 && len(args) > 0 || cmd.ArgsLenAtDash() > 0 {
				return fmt.Errorf("put the training command after --: gpupass train … -- %s", strings.Join(args, " "))
			}
			o.Command = args
			o.Getenv = os.Getenv
			return RunTrain(cmd.Context(), o, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	o.AddFlags(cmd)
	return cmd
}

// runName is the base name of the runs: --name or the spec's name, plus
// the short commit in CI (the broker adds the region).
func (o *TrainOptions) runName(specYAML []byte) string {
	name := o.Name
	if name == "" {
		var s struct {
			Name string `yaml:"name"`
		}
		_ = yaml.Unmarshal(specYAML, &s) // the broker reports a bad spec
		name = s.Name
	}
	getenv := o.Getenv
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	sha := getenv("CI_COMMIT_SHORT_SHA")
	if sha == "" {
		sha = getenv("GITHUB_SHA")
	}
	if len(sha) > 7 {
		sha = sha[:7]
	}
	if sha != "" {
		if name == "" {
			name = "run"
		}
		name += "-" + sha
	}
	return name
}

// RunTrain submits the runs and, with Follow, streams them to the end.
func RunTrain(ctx context.Context, o *TrainOptions, out, errOut io.Writer) error {
	if len(o.Regions) == 0 {
		return errors.New("no region: pass --region R (repeat for several)")
	}
	seen := map[string]bool{}
	for _, r := range o.Regions {
		if seen[r] {
			return fmt.Errorf("--region %s is given twice; one run per region", r)
		}
		seen[r] = true
	}
	if len(o.Command) == 0 {
		return errors.New("no command: gpupass train … -- COMMAND [ARG…]")
	}
	if o.MaxPrice < 0 || o.MaxRestarts < 0 {
		return errors.New("--max-price and --max-restarts must not be negative")
	}
	specYAML, err := os.ReadFile(o.Spec)
	if errors.Is(err, fs.ErrNotExist) {
		// The message validate gives for a missing spec: what to run next.
		abs, _ := filepath.Abs(o.Spec)
		return fmt.Errorf("no %s in %s: run `gpupass init` for a starter spec, or pass --spec FILE", filepath.Base(abs), filepath.Dir(abs))
	}
	if err != nil {
		return fmt.Errorf("reading spec %s: %w", o.Spec, err)
	}
	var archive []byte
	if o.Workdir != "" {
		if archive, err = archiveDir(o.Workdir, o.WorkdirLimits); err != nil {
			return fmt.Errorf("--workdir: %w", err)
		}
	}
	c, err := o.Broker.DialRuns()
	if err != nil {
		return err
	}
	jsonOut := o.Global != nil && o.Global.Output == "json"
	name := o.runName(specYAML)
	if o.Name != "" {
		if err := api.CheckRunName(name); err != nil {
			return fmt.Errorf("--name: %w", err)
		}
	}
	restarts := int32(o.MaxRestarts)
	minScore := o.MinHealthScore
	var runs []*gpupassv1.Run
	for _, region := range o.Regions {
		resp, err := c.Run.Submit(ctx, connect.NewRequest(&gpupassv1.SubmitRequest{
			Spec: &gpupassv1.SubmitRequest_SpecYaml{SpecYaml: specYAML}, Region: region, Name: name, Command: o.Command,
			WorkdirArchive: archive, MaxPrice: o.MaxPrice, MaxRestarts: &restarts, ResumeElsewhere: o.ResumeElsewhere,
			MinHealthScore: &minScore}))
		if err != nil {
			o.observe(runs)
			return rpcError("submitting the run in "+region, o.Broker.URL, err)
		}
		runs = append(runs, resp.Msg.Run)
	}
	o.observe(runs)
	if !jsonOut {
		writeRunTable(out, runs)
	}
	if o.Follow {
		log := o.Global.logger(errOut)
		p := &logPrinter{out: out, json: jsonOut, prefix: !jsonOut}
		var wg sync.WaitGroup
		errs := make([]error, len(runs))
		for i, r := range runs {
			if terminal(r.State) {
				continue
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				fin, err := followRun(ctx, c, r, 0, true, false, p, log)
				if err != nil {
					errs[i] = err
					return
				}
				runs[i] = fin
			}()
		}
		wg.Wait()
		if err := errors.Join(errs...); err != nil {
			return err
		}
	}
	if jsonOut {
		if err := runview.WriteList(out, runs); err != nil {
			return err
		}
	} else if o.Follow {
		fmt.Fprintln(out)
		writeRunTable(out, runs)
	}
	if o.Follow {
		o.observe(runs)
	}
	var bad []string
	for _, r := range runs {
		if r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || r.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
			bad = append(bad, fmt.Sprintf("%s (%s) %s: %s", r.Id, termsafe.String(r.Region), stateName(r.State), termsafe.String(r.Reason)))
		}
	}
	if len(bad) > 0 {
		return Findings(fmt.Errorf("%d of %d runs did not succeed: %s", len(bad), len(runs), strings.Join(bad, "; ")))
	}
	return nil
}

func (o *TrainOptions) observe(runs []*gpupassv1.Run) {
	if o.Observe != nil && len(runs) > 0 {
		o.Observe(slices.Clone(runs))
	}
}

// logger tolerates a nil GlobalOptions (library callers).
func (o *GlobalOptions) logger(w io.Writer) *slog.Logger {
	if o == nil {
		return (&GlobalOptions{}).Logger(w)
	}
	return o.Logger(w)
}

// writeRunTable prints runs: id, region, state, node, score, price.
func writeRunTable(out io.Writer, runs []*gpupassv1.Run) {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ALLOC\tNAME\tREGION\tSTATE\tNODE\tSCORE\tPRICE/H\tREASON")
	for _, r := range runs {
		score, price := "-", "-"
		if r.Score != nil {
			score = fmt.Sprintf("%.1f", r.Score.Score)
		}
		if r.PricePerHour > 0 {
			price = f2(r.PricePerHour)
		}
		st := stateName(r.State)
		if r.CancelRequested && !terminal(r.State) {
			st += " (cancelling)"
		}
		if r.Simulated {
			st += ", simulated"
		}
		if r.LogDisputed {
			st += ", LOG DISPUTED"
		}
		node := dash(r.NodeId)
		if s := runview.SlurmOf(r); s != nil {
			node += " (" + s.String() + ")"
		}
		// Names and reasons come from submitters, nodes and jobs:
		// printed escaped, a tab included (it would shift the columns).
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termsafe.String(r.Id), termsafe.String(r.Name), termsafe.String(r.Region), st,
			termsafe.String(node), score, price, termsafe.String(dash(r.Reason)))
	}
	_ = tw.Flush()
}
