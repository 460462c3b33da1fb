package gpupass

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"sync"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/ci"
)

// runCI runs train as a pipeline step (-o github|gitlab): the runs as
// the command prints them in the log, then the allocation ids handed on
// (the allocation-ids output, JSON region → id, and on GitLab
// GPUPASS_ALLOCATION_<REGION> in the dotenv file, which the
// compare-report and audit jobs read) and the job summary.
func (o *TrainOptions) runCI(ctx context.Context, kind ci.Kind, out, errOut io.Writer) error {
	env := ci.New(kind, o.Getenv, errOut)
	// Closed before a --model-ref push opens its own: groups do not nest.
	endGroup := sync.OnceFunc(env.Group("gpupass train"))
	defer endGroup()
	var missing []string
	for _, f := range []struct {
		flag string
		set  bool
	}{{"broker-url", o.Broker.URL != ""}, {"broker-token", o.Broker.Token != ""}, {"region", len(o.Regions) > 0}, {"command", len(o.Command) > 0}} {
		if !f.set {
			missing = append(missing, CIFlag(o.Global.format(), f.flag))
		}
	}
	if len(missing) > 0 {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("train: missing %s", strings.Join(missing, ", "))}
	}
	names := maps.Clone(ciFlagNames(trainFlagNames, o.Global.Output))
	names["Command"], names[api.FieldSubmitCommand] = CIFlag(o.Global.format(), "command"), CIFlag(o.Global.format(), "command")
	res, runErr := runTrain(ctx, o, names, out, errOut)
	if res == nil || len(res.Runs) == 0 {
		return runErr
	}
	if err := stepOutputs(env, res); err != nil {
		return errors.Join(runErr, err)
	}
	if err := env.Summary(trainSummary("train", res.Runs)); err != nil || runErr != nil {
		return errors.Join(runErr, err)
	}
	endGroup()
	return o.pushModel(ctx, res, out, errOut)
}

// stepOutputs hands the runs of a train or wait step on: the
// allocation-ids output (JSON region → id), the group output (the id
// `gpupass wait`, compare and the broker's webhook name them by), on
// GitLab GPUPASS_ALLOCATION_<REGION> too. The caller writes the job
// summary (trainSummary) once the runs are as it reports them.
func stepOutputs(env *ci.Env, res *apptrain.Result) error {
	runs := res.Runs
	ids := map[string]string{}
	for _, r := range runs {
		ids[r.Region] = r.Id
	}
	doc, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	if err := env.SetOutput("allocation-ids", string(doc)); err != nil {
		return err
	}
	if res.Group != "" {
		if err := env.SetOutput("group", res.Group); err != nil {
			return err
		}
	}
	if env.Kind() == ci.GitLab {
		named := map[string]string{}
		for _, r := range runs {
			out := "allocation-" + outputSuffix(r.Region)
			if other, dup := named[out]; dup && other != r.Region {
				return fmt.Errorf("regions %s and %s both give the output %s: rename one, or read allocation-ids (JSON, region → id) instead", other, r.Region, out)
			}
			named[out] = r.Region
			if err := env.SetOutput(out, r.Id); err != nil {
				return err
			}
		}
	}
	return nil
}

// outputSuffix turns a region into the tail of an output name: region
// names are free-form (eu_central, ap.south-1), output names kebab-case,
// so anything but a lowercase letter, digit or '-' becomes '-'.
func outputSuffix(region string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, region)
}

// trainSummary is the job summary of a train or wait step (command):
// one row per run.
func trainSummary(command string, runs []*gpupassv1.Run) string {
	var b strings.Builder
	b.WriteString("### gpupass " + command + "\n\n| region | allocation | run | state | node | score |\n|---|---|---|---|---|---|\n")
	for _, r := range runs {
		score := "-"
		if r.Score != nil {
			score = fmt.Sprintf("%.1f", r.Score.Score)
		}
		st := stateName(r.State)
		if r.Simulated {
			st += " (simulated)"
		}
		if r.Reason != "" {
			st += ": " + r.Reason
		}
		fmt.Fprintf(&b, "| %s | `%s` | %s | %s | %s | %s |\n", r.Region, r.Id, r.Name, strings.ReplaceAll(st, "|", `\|`), dash(r.NodeId), score)
	}
	return b.String()
}
