package metrics

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// lossColumns are tried in order when no metric is named.
var lossColumns = []string{"loss", "train_loss", "train_loss_step", "train/loss", "loss_step"}

// pickLoss chooses the training loss among names: a known name first, else
// the first name containing "loss" that is not a validation or test loss.
func pickLoss(names []string) string {
	for _, want := range lossColumns {
		for _, n := range names {
			if n == want {
				return n
			}
		}
	}
	for _, n := range names {
		l := strings.ToLower(n)
		if strings.Contains(l, "loss") && !strings.HasPrefix(l, "val") && !strings.HasPrefix(l, "test") {
			return n
		}
	}
	return ""
}

// ReadCSV reads a Lightning CSVLogger metrics.csv: a header with "step"
// and metric columns, rows that fill only the columns logged at that step.
// A "time", "timestamp" or "ts" column, when present, holds RFC 3339 or
// epoch seconds.
func ReadCSV(r io.Reader, source string, opt Options) (*Series, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	header, err := cr.Read()
	if err == io.EOF {
		return nil, &EmptyError{Source: source, Metric: opt.Metric}
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s header: %w", source, err)
	}
	header = append([]string(nil), header...)
	col := map[string]int{}
	for i, h := range header {
		col[strings.TrimSpace(h)] = i
	}
	stepCol, ok := col["step"]
	if !ok {
		if stepCol, ok = col["global_step"]; !ok {
			return nil, fmt.Errorf("%s: header has no \"step\" column (found %s); is this a Lightning CSVLogger metrics.csv?", source, strings.Join(header, ","))
		}
	}
	metric := opt.Metric
	if metric == "" {
		metric = pickLoss(header)
	}
	valCol, ok := col[metric]
	if !ok {
		return nil, fmt.Errorf("%s: no column %q (columns: %s); choose one with --metric", source, metric, strings.Join(header, ","))
	}
	timeCol := -1
	for _, n := range []string{"time", "timestamp", "ts", "wall_time"} {
		if i, ok := col[n]; ok {
			timeCol = i
			break
		}
	}
	s := &Series{Source: source, Metric: metric, Format: "csv"}
	for {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				s.Problems.Add("line "+strconv.Itoa(pe.Line), pe.Err.Error())
				continue
			}
			return nil, fmt.Errorf("reading %s: %w", source, err)
		}
		line, _ := cr.FieldPos(0)
		where := lineRef(line)
		if len(rec) != len(header) {
			s.Problems.Add(where.String(), fmt.Sprintf("%d fields, header has %d", len(rec), len(header)))
			continue
		}
		v := strings.TrimSpace(rec[valCol])
		if v == "" {
			continue
		}
		val, err := strconv.ParseFloat(v, 64)
		if err != nil {
			s.Problems.Add(where.String(), fmt.Sprintf("%s %q is not a number", metric, v))
			continue
		}
		stepF, err := strconv.ParseFloat(strings.TrimSpace(rec[stepCol]), 64)
		if err != nil || stepF != math.Trunc(stepF) || math.Abs(stepF) > MaxStep {
			s.Problems.Add(where.String(), fmt.Sprintf("step %q is not an integer", rec[stepCol]))
			continue
		}
		p := Point{Step: int64(stepF), Value: val}
		if timeCol >= 0 {
			if t := strings.TrimSpace(rec[timeCol]); t != "" {
				ts, err := parseTime(t)
				if err != nil {
					s.Problems.Add(where.String(), err.Error())
					continue
				}
				p.Time = ts
			}
		}
		s.Points = append(s.Points, p)
		if len(s.Points) == sizeSample && opt.SizeHint > 0 {
			s.Points = presize(s.Points, cr.InputOffset(), opt.SizeHint)
		}
	}
	if len(s.Points) == 0 {
		return nil, &EmptyError{Source: source, Metric: metric, Problems: s.Problems}
	}
	s.Normalize()
	return s, nil
}

func parseTime(v string) (int64, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC().UnixNano(), nil
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return epochSeconds(f)
	}
	return 0, fmt.Errorf("time %q is neither RFC 3339 nor epoch seconds", v)
}
