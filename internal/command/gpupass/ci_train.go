package gpupass

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	apptrain "github.com/gpupass/gpupass/internal/app/train"
	"github.com/gpupass/gpupass/internal/ci"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/workdir"
)

// train runs `gpupass train --follow` in every region of the regions
// input and hands the allocation ids on: the allocation-ids output (JSON,
// region → id) and, on GitLab, GPUPASS_ALLOCATION_<REGION> in the dotenv
// file, which the compare-report and audit jobs read.
func (o *CIStepOptions) train(ctx context.Context, env *ci.Env, out io.Writer) error {
	if err := o.Require("broker-url", o.BrokerURL, "broker-token", o.BrokerToken, "regions", o.Regions, "train-command", o.TrainCommand); err != nil {
		return err
	}
	regions := strings.FieldsFunc(o.Regions, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' || r == '\t' })
	words, err := apptrain.SplitCommand(o.TrainCommand)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("input train-command: %w", err)}
	}
	spec := o.Spec
	if spec == "" {
		spec = "gpupass.yaml"
	}
	t := &TrainOptions{
		Global: o.Global, Broker: *o.Broker(), Follow: true,
		Options: apptrain.Options{Spec: spec, Regions: regions, Name: o.Name, MaxRestarts: 3, MinHealthScore: api.DefaultMinHealthScore,
			TimeLimit: o.TimeLimit, Workdir: o.Workdir, NoWorkdir: o.Workdir == "", WorkdirLimits: workdir.Default(), Command: words, Getenv: o.Getenv},
	}
	res, runErr := runTrain(ctx, t, ciTrainInputs, out, o.ErrOut)
	if res == nil || len(res.Runs) == 0 {
		return runErr
	}
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
		return errors.Join(runErr, err)
	}
	if env.Kind() == ci.GitLab {
		named := map[string]string{}
		for _, r := range runs {
			out := "allocation-" + outputSuffix(r.Region)
			if other, dup := named[out]; dup && other != r.Region {
				return errors.Join(runErr, fmt.Errorf("regions %s and %s both give the output %s: rename one, or read allocation-ids (JSON, region → id) instead", other, r.Region, out))
			}
			named[out] = r.Region
			if err := env.SetOutput(out, r.Id); err != nil {
				return errors.Join(runErr, err)
			}
		}
	}
	return errors.Join(runErr, env.Summary(trainSummary(runs)))
}

// ciTrainInputs maps the train use case's option fields to the inputs.
var ciTrainInputs = fielderr.Names{"Regions": "input regions", "Command": "input train-command", "Spec": "input spec", "Workdir": "input workdir", "Name": "input name", "TimeLimit": "input time-limit",
	api.FieldSubmitCommand: "input train-command", api.FieldSubmitName: "input name", api.FieldSubmitWorkdir: "input workdir", api.FieldSubmitTimeLimit: "input time-limit"}

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

// trainSummary is the job summary: one row per run.
func trainSummary(runs []*gpupassv1.Run) string {
	var b strings.Builder
	b.WriteString("### gpupass train\n\n| region | allocation | run | state | node | score |\n|---|---|---|---|---|---|\n")
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
