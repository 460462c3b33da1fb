package metrics

import (
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// lossColumns are the training loss's names, tried in order when no
// metric is named (CSV columns, TensorBoard tags, MLflow keys).
var lossColumns = []string{"loss", "train_loss", "train_loss_step", "training_loss", "train/loss", "loss_step"}

// pickLoss chooses the training loss among names: a known name first, else
// the first name trainingLoss accepts.
func pickLoss(names []string) string {
	for _, want := range lossColumns {
		if slices.Contains(names, want) {
			return want
		}
	}
	for _, n := range names {
		if trainingLoss(n) {
			return n
		}
	}
	return ""
}

// trainingLoss says whether a metric's name is a loss of the training
// data: it contains "loss" and what comes before names no held-out data
// (val_loss, valid/loss, eval_loss, test_loss; not value_loss).
func trainingLoss(name string) bool {
	l := strings.ToLower(name)
	i := strings.Index(l, "loss")
	return i >= 0 && !heldOut().MatchString(l[:i])
}

// ReadCSV reads a Lightning CSVLogger metrics.csv: a header with "step"
// and metric columns, rows that fill only the columns logged at that step.
// A "time", "timestamp" or "ts" column, when present, holds RFC 3339 or
// epoch seconds.
//
// Lines are read with the same bounded reader as JSONL and parsed one at a
// time: encoding/csv over the whole stream would buffer a 2 GB line (or
// everything after an unclosed quote) in memory. A quoted field may
// therefore not span lines, which CSVLogger never writes.
func ReadCSV(r io.Reader, source string, opt Options) (*Series, error) {
	ln := newLines(r)
	var header []string
	for header == nil {
		line, err := ln.next()
		if err == io.EOF {
			return nil, &EmptyError{Source: source, Metric: opt.Metric}
		}
		if err != nil {
			return nil, fmt.Errorf("reading %s header: %w", source, err)
		}
		if ln.long {
			return nil, fmt.Errorf("%s: line %d: header line longer than 1 MiB; is this a Lightning CSVLogger metrics.csv?", source, ln.n)
		}
		line = bytes.TrimPrefix(line, []byte("\ufeff"))
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		if header, err = csvFields(line, nil); err != nil {
			return nil, fmt.Errorf("%s: line %d: header: %w", source, ln.n, err)
		}
		header = append([]string(nil), header...)
	}
	col := map[string]int{}
	for i, h := range header {
		// Trimmed once, for the lookups below and pickLoss alike.
		header[i] = strings.TrimSpace(h)
		col[header[i]] = i
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
		return nil, fielderr.New(FieldMetric, metric, "%s has no such column (columns: %s); choose one of them", source, strings.Join(header, ","))
	}
	timeCol := -1
	for _, n := range []string{"time", "timestamp", "ts", "wall_time"} {
		if i, ok := col[n]; ok {
			timeCol = i
			break
		}
	}
	s := &Series{Source: source, Metric: metric, Format: "csv"}
	var rec []string
	for {
		line, where, err := ln.read(source, &s.Problems)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if len(bytes.TrimSpace(line)) == 0 {
			continue
		}
		rec, err = csvFields(line, rec[:0])
		if err != nil {
			s.Problems.Add(where.String(), err.Error())
			continue
		}
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
			s.Points = presize(s.Points, ln.bytes, opt.SizeHint)
		}
	}
	if len(s.Points) == 0 {
		return nil, &EmptyError{Source: source, Metric: metric, Problems: s.Problems}
	}
	s.Normalize()
	return s, nil
}

// csvFields splits one CSV line into rec. Lines without quotes (every
// CSVLogger row) are split on commas; quoted ones go through encoding/csv,
// bounded to this line.
func csvFields(line []byte, rec []string) ([]string, error) {
	if bytes.IndexByte(line, '"') < 0 {
		// One string for the line, fields sliced from it: one allocation
		// a row, as encoding/csv's ReuseRecord.
		str := string(line)
		for {
			i := strings.IndexByte(str, ',')
			if i < 0 {
				return append(rec, str), nil
			}
			rec = append(rec, str[:i])
			str = str[i+1:]
		}
	}
	cr := csv.NewReader(bytes.NewReader(line))
	cr.FieldsPerRecord = -1
	fields, err := cr.Read()
	if err != nil {
		var pe *csv.ParseError
		if errors.As(err, &pe) {
			return nil, pe.Err
		}
		return nil, err
	}
	if _, err := cr.Read(); err != io.EOF {
		return nil, errors.New(`quoted field spans lines (or a stray quote)`)
	}
	return append(rec, fields...), nil
}

func parseTime(v string) (int64, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		if !events.InNanoRange(t) {
			return 0, fmt.Errorf(errTimeRange, v)
		}
		return t.UnixNano(), nil
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		return epochSeconds(f)
	}
	return 0, fmt.Errorf("time %q is neither RFC 3339 nor epoch seconds", v)
}
