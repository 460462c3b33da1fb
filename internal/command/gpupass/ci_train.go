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
	"github.com/gpupass/gpupass/internal/ci"
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
	words, err := splitCommand(o.TrainCommand)
	if err != nil {
		return &ExitError{Code: ExitUsage, Err: fmt.Errorf("input train-command: %w", err)}
	}
	spec := o.Spec
	if spec == "" {
		spec = "gpupass.yaml"
	}
	var runs []*gpupassv1.Run
	t := &TrainOptions{
		Global: o.Global, Broker: BrokerFlags{URL: o.BrokerURL, Token: o.BrokerToken},
		Spec: spec, Regions: regions, Name: o.Name, Follow: true,
		MaxRestarts: 3, MinHealthScore: api.DefaultMinHealthScore,
		Workdir: o.Workdir, Command: words, Getenv: o.Getenv,
		Observe: func(rs []*gpupassv1.Run) { runs = rs },
	}
	runErr := RunTrain(ctx, t, out, o.ErrOut)
	if len(runs) == 0 {
		return runErr
	}
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

// splitCommand splits the train-command input into words: a JSON list of
// strings, or words separated by blanks, with '…' and "…" quoting and \
// escapes as a POSIX shell reads them (no expansion of any kind: the
// node runs the words directly, never through a shell).
func splitCommand(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") {
		var words []string
		if err := json.Unmarshal([]byte(s), &words); err != nil {
			return nil, fmt.Errorf("not a JSON list of strings: %w", err)
		}
		if len(words) == 0 {
			return nil, errors.New("empty JSON list")
		}
		return words, nil
	}
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case quote == '"':
			switch {
			case c == '"':
				quote = 0
			case c == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
				i++
				cur.WriteRune(rs[i])
			default:
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '\\':
			if i+1 == len(rs) {
				return nil, errors.New("ends with a backslash")
			}
			i++
			cur.WriteRune(rs[i])
			in = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("empty")
	}
	return words, nil
}
