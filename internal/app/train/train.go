// Package train is the train use case: submit one run per region to the
// broker (Submit), stream their logs to the end (Follow), and say which
// did not succeed (Result.Err). The gpupass command calls it and renders
// the typed Result (WriteTable, runview's JSON, and with -o github|gitlab
// the CI step's outputs). No cobra, no flag names: bad options are
// *fielderr.Error naming the Options field.
package train

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"connectrpc.com/connect"
	"gopkg.in/yaml.v3"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/app/brokerrpc"
	"github.com/gpupass/gpupass/internal/app/runlog"
	"github.com/gpupass/gpupass/internal/app/validate"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/exitcode"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/termsafe"
	"github.com/gpupass/gpupass/internal/workdir"
)

// MaxArchive is the broker's Submit limit less room for the rest of the
// request: the most a packed work dir may weigh.
const MaxArchive = api.MaxSubmitBytes - 1<<20

// Options say what to run where.
type Options struct {
	// Spec is the run's spec file.
	Spec    string
	Regions []string
	// Name is the runs' base name (default: the spec's name); the region
	// and, in CI, the short commit are added.
	Name        string
	MaxPrice    float64
	MaxRestarts int
	// MaxRestartsSet says MaxRestarts was given (--max-restarts); else
	// the broker's default applies: 3 for a run on one node, none for a
	// run across several (whose restart is not there yet).
	MaxRestartsSet  bool
	ResumeElsewhere bool
	// RequireBandwidth fails a run across several nodes whose link,
	// measured at gang start, is below the spec's
	// resources.network.bandwidth_gbps (else a recorded shortfall).
	RequireBandwidth bool
	MinHealthScore   float64
	// TimeLimit is each run's wall-clock limit as written ("90m";
	// spec.ParseTimeLimit); it overrides the spec's resources.time-limit.
	// Empty: the spec's, if any.
	TimeLimit string
	// QueueTimeout is how long each run may wait in its region's queue
	// for a busy node, as written ("30m"; spec.ParseQueueTimeout); it
	// overrides the spec's resources.queue-timeout. Empty: the spec's.
	QueueTimeout string
	// MetricPattern, when set, becomes the run spec's metrics.pattern
	// (metrics.CompilePattern): how the agent finds the loss in the
	// job's own log lines. It leaves the fingerprint alone.
	MetricPattern string
	// Workdir is shipped to each node as the command's work dir; empty:
	// the spec's directory, which holds the files its command names
	// (train.py next to gpupass.yaml), unless NoWorkdir.
	Workdir       string
	NoWorkdir     bool
	WorkdirLimits workdir.Limits
	// WorkdirInclude names files of the work dir that look like secrets
	// (keys, .env, tokens) and are shipped all the same.
	WorkdirInclude []string
	// StateDirs are gpupass state dirs never shipped, besides those
	// holding workdir.StateMarker (`up`'s configured one, for a state
	// dir written before markers).
	StateDirs []string
	// Command is what runs on each node.
	Command []string
	// Getenv reads the CI's variables for the run name.
	Getenv func(string) string
	// CI is the CI job the runs are submitted from (nil: none): the
	// broker keeps it with their run group, for the group's webhook.
	CI *gpupassv1.CIContext
	// Dial returns the broker's runs API, once the options checked out.
	Dial func() (*client.RunClients, error)
}

// Result holds the runs as last seen: as submitted, or as ended after
// Follow.
type Result struct {
	Runs []*gpupassv1.Run
	// Group is the run group the broker drew for the first run and the
	// others joined ("" from a broker without groups).
	Group string
	// Workdir is what was shipped; nil when nothing was.
	Workdir *Workdir
	// c is the broker the runs were submitted to, for Follow.
	c *client.RunClients
	// spec is the spec file's path as given, for the hints of Err.
	spec string
}

// Submit checks the options and submits one run per region, in order. A
// failed submit returns the runs submitted before it with the error, so
// the caller can still hand their ids on.
func Submit(ctx context.Context, o Options) (*Result, error) {
	if len(o.Regions) == 0 {
		return nil, &fielderr.Error{Field: "Regions", Problem: "is required: " + "no region to train in; one run per region"}
	}
	seen := map[string]bool{}
	for _, r := range o.Regions {
		if api.CheckRegion(r) != nil {
			return nil, fielderr.New("Regions", r, "not a region name: use %s", api.RegionRule)
		}
		if seen[r] {
			return nil, fielderr.New("Regions", r, "given twice; one run per region")
		}
		seen[r] = true
	}
	if len(o.Command) == 0 {
		return nil, &fielderr.Error{Field: "Command", Problem: "is required: " + "no command for the nodes to run"}
	}
	if o.MaxPrice < 0 {
		return nil, fielderr.New("MaxPrice", fmt.Sprint(o.MaxPrice), "must not be negative")
	}
	if o.MaxRestarts < 0 {
		return nil, fielderr.New("MaxRestarts", fmt.Sprint(o.MaxRestarts), "must not be negative")
	}
	var limit time.Duration
	if o.TimeLimit != "" {
		var err error
		if limit, err = spec.ParseTimeLimit(o.TimeLimit); err != nil {
			return nil, &fielderr.Error{Field: "TimeLimit", Value: o.TimeLimit, Err: err}
		}
	}
	var queueTimeout time.Duration
	if o.QueueTimeout != "" {
		var err error
		if queueTimeout, err = spec.ParseQueueTimeout(o.QueueTimeout); err != nil {
			return nil, &fielderr.Error{Field: "QueueTimeout", Value: o.QueueTimeout, Err: err}
		}
	}
	specYAML, err := os.ReadFile(o.Spec)
	if errors.Is(err, fs.ErrNotExist) {
		// The message validate gives for a missing spec: what to run next.
		abs, _ := filepath.Abs(o.Spec)
		// The default name, from a subdirectory of a project: its spec
		// (a path of ".." and a spec file name, safe to paste).
		if slices.Contains(validate.SpecFileNames, o.Spec) {
			if above := validate.SpecAbove("."); above != "" {
				return nil, fielderr.New("Spec", o.Spec, "no %s in %s; the project's spec is %s: pass {Spec} %s", o.Spec, filepath.Dir(abs), above, above)
			}
		}
		return nil, fielderr.New("Spec", o.Spec, "no %s in %s: run `gpupass init` for a starter spec, or name another spec file", filepath.Base(abs), filepath.Dir(abs))
	}
	if err != nil {
		return nil, fmt.Errorf("reading spec %s: %w", o.Spec, err)
	}
	if o.MetricPattern != "" {
		if _, err := metrics.CompilePattern(o.MetricPattern); err != nil {
			return nil, &fielderr.Error{Field: "MetricPattern", Value: o.MetricPattern, Problem: err.Error()}
		}
		if specYAML, err = spec.SetMetricPattern(specYAML, o.MetricPattern); err != nil {
			return nil, fmt.Errorf("%s: %w", o.Spec, err)
		}
	}
	wd, err := PackWorkdir(o)
	if err != nil {
		return nil, err
	}
	var archive []byte
	if wd != nil {
		archive = wd.Archive
	}
	// The spec travels as the bytes its fingerprint is computed from; the
	// file as written goes beside it for the audit. A spec that is not
	// valid goes as written alone: the broker names its findings.
	_, specJSON, err := spec.EncodeFile(o.Spec, specYAML)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Spec, err)
	}
	name := RunName(o.Name, specYAML, o.Getenv)
	if o.Name != "" {
		if err := api.CheckRunName(name); err != nil {
			return nil, &fielderr.Error{Field: "Name", Value: o.Name, Err: err}
		}
	}
	c, err := o.Dial()
	if err != nil {
		return nil, err
	}
	var restarts *int32
	if o.MaxRestartsSet {
		n := int32(o.MaxRestarts)
		restarts = &n
	}
	minScore := o.MinHealthScore
	res := &Result{c: c, Workdir: wd, spec: o.Spec}
	for _, region := range o.Regions {
		req := &gpupassv1.SubmitRequest{
			SpecYaml: specYAML, SpecJson: specJSON, Region: region, Name: name, Command: o.Command,
			WorkdirArchive: archive, MaxPrice: o.MaxPrice, MaxRestarts: restarts, ResumeElsewhere: o.ResumeElsewhere, RequireBandwidth: o.RequireBandwidth,
			MinHealthScore: &minScore, TimeLimitSeconds: int64(limit / time.Second), Group: res.Group,
			GroupSize: int32(len(o.Regions)), QueueTimeoutSeconds: int64(queueTimeout / time.Second)}
		if res.Group == "" {
			req.Ci = o.CI // the request that starts the group gives its context
		}
		resp, err := c.Run.Submit(ctx, connect.NewRequest(req))
		if err != nil {
			return res, brokerrpc.Error("submitting the run in "+region, c.URL, err)
		}
		res.Runs = append(res.Runs, resp.Msg.Run)
		// The first run's group, drawn by the broker, takes the others.
		res.Group = resp.Msg.Run.GetGroup()
	}
	return res, nil
}

// Workdir is a packed work dir and the directory it was packed from.
type Workdir struct {
	Dir string
	*workdir.Packed
}

// WorkdirDir is the directory o ships: Workdir, else the spec's
// directory; "" with NoWorkdir.
func WorkdirDir(o Options) (string, error) {
	switch {
	case o.NoWorkdir && o.Workdir != "":
		return "", &fielderr.Error{Field: "Workdir", Value: o.Workdir, Problem: "and {NoWorkdir} exclude each other: give one"}
	case o.NoWorkdir && len(o.WorkdirInclude) > 0:
		return "", &fielderr.Error{Field: "WorkdirInclude", Value: o.WorkdirInclude[0], Problem: "and {NoWorkdir} exclude each other: nothing is shipped"}
	case o.NoWorkdir:
		return "", nil
	case o.Workdir != "":
		return o.Workdir, nil
	}
	return filepath.Dir(o.Spec), nil
}

// PackWorkdir packs the work dir o ships (WorkdirDir); nil, nil when it
// ships none.
func PackWorkdir(o Options) (*Workdir, error) {
	dir, err := WorkdirDir(o)
	if err != nil || dir == "" {
		return nil, err
	}
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, fielderr.New("Workdir", dir, "not a directory: name the directory to ship, or {NoWorkdir} to ship none")
	}
	p, err := workdir.Pack(dir, workdir.PackOptions{Limits: o.WorkdirLimits, MaxCompressed: MaxArchive, Include: o.WorkdirInclude, StateDirs: o.StateDirs})
	var ie *workdir.IncludeError
	if errors.As(err, &ie) {
		return nil, fielderr.New("WorkdirInclude", ie.Path, "not a file of %s that looks like a secret (none there, or an ignore rule leaves it out): name it as the refusal printed it", dir)
	}
	if err != nil {
		e := &fielderr.Error{Field: "Workdir", Value: dir, Err: err}
		if o.Workdir == "" {
			e.Problem = "the spec's directory, shipped by default ({Workdir} DIR ships another, {NoWorkdir} none): " + err.Error()
		}
		return nil, e
	}
	return &Workdir{Dir: dir, Packed: p}, nil
}

// FollowOptions say where the followed logs go.
type FollowOptions struct {
	// Out receives every run's records: text lines prefixed by region,
	// or with JSON one object per record.
	Out    io.Writer
	JSON   bool
	Logger *slog.Logger
}

// Follow streams the logs of every run in res that has not ended until
// it ends, and updates res.Runs to the ended runs.
func Follow(ctx context.Context, o FollowOptions, res *Result) error {
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &runlog.Printer{Out: o.Out, JSON: o.JSON, Prefix: !o.JSON}
	var wg sync.WaitGroup
	errs := make([]error, len(res.Runs))
	for i, r := range res.Runs {
		if runview.Terminal(r.State) {
			continue
		}
		wg.Go(func() {
			fin, err := runlog.FollowGang(ctx, res.c, r, 0, true, false, p, log)
			if err != nil {
				errs[i] = err
				return
			}
			res.Runs[i] = fin
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Err is a findings error (exit code 1) naming every run that failed or
// was cancelled, else nil.
func (r *Result) Err() error {
	var bad []string
	for _, run := range r.Runs {
		if run.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || run.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED {
			why := fmt.Sprintf("%s (%s) %s", run.Id, termsafe.String(run.Region), events.Outcome(runview.State(run.State), termsafe.String(run.Reason)))
			if run.State == gpupassv1.AllocState_ALLOC_STATE_FAILED && run.NodeId == "" && !queueExpired(run) {
				// Never placed: the broker says why in its words; the
				// command that shows every node's reason is the CLI's.
				why += " (every node's reason: " + r.dryRunHint(run.Region) + ")"
			}
			bad = append(bad, why)
		}
	}
	if len(bad) == 0 {
		return nil
	}
	return &exitcode.Error{Code: exitcode.Findings, Err: fmt.Errorf("%d of %d runs did not succeed: %s", len(bad), len(r.Runs), strings.Join(bad, "; "))}
}

// queueExpired says the run failed waiting in its region's queue (its
// --queue-timeout): nodes could take it but were all busy, so the
// dry-run's reasons per node would show nothing to fix, and the broker's
// reason already says what to do ("raise --queue-timeout or add nodes").
func queueExpired(run *gpupassv1.Run) bool {
	return run.GetQueuedUnixNano() != 0 && strings.HasPrefix(run.GetReason(), "waited ")
}

// dryRunHint is the command that says, node by node, why a run of the
// spec in region found no node.
func (r *Result) dryRunHint(region string) string {
	cmd := "gpupass validate --dry-run"
	if r.spec != "" && !slices.Contains(validate.SpecFileNames, r.spec) {
		cmd += " --spec " + termsafe.ShellQuote(r.spec)
	}
	return cmd + " --region " + termsafe.ShellQuote(region) + " --excluded summary"
}

// RunName is the base name of the runs: name or the spec's name, plus
// the short commit in CI (the broker adds the region).
func RunName(name string, specYAML []byte, getenv func(string) string) string {
	if name == "" {
		var s struct {
			Name string `yaml:"name"`
		}
		_ = yaml.Unmarshal(specYAML, &s) // the broker reports a bad spec
		name = s.Name
	}
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

// WriteTable prints runs: id, name, region, state, queue position, node,
// score, price, limit, reason.
func WriteTable(out io.Writer, runs []*gpupassv1.Run) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ALLOC\tNAME\tREGION\tSTATE\tQUEUE\tNODE\tSCORE\tPRICE/H\tLIMIT\tREASON")
	for _, r := range runs {
		score, price := "-", "-"
		if r.Score != nil {
			score = fmt.Sprintf("%.1f", r.Score.Score)
		}
		if r.PricePerHour > 0 {
			price = f2(r.PricePerHour)
		}
		st := runview.State(r.State)
		if r.CancelRequested && !runview.Terminal(r.State) {
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
		limit := "-"
		if r.TimeLimitSeconds > 0 {
			limit = spec.FormatTimeLimit(time.Duration(r.TimeLimitSeconds) * time.Second)
		}
		// QUEUE: the run's place in its region's queue while it waits
		// for a busy node.
		queue := "-"
		if r.QueuePosition > 0 {
			queue = fmt.Sprint(r.QueuePosition)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", termsafe.String(r.Id), termsafe.String(r.Name), termsafe.String(r.Region), st, queue,
			termsafe.String(node), score, price, limit, termsafe.String(dash(r.Reason)))
	}
	return tw.Flush()
}

func f2(v float64) string {
	if v == math.Trunc(v) {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
