package metrics

import (
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
)

// MLflow's file store keeps each metric of a run in its own file,
// mlruns/<experiment>/<run>/metrics/<key> (a key with slashes is a
// path below metrics/), one `<timestamp ms> <value> <step>` line per
// logged point (files of MLflow before 1.0 have no step).

// mlflowMetricsDir finds the metrics directory of one MLflow run given
// the run's directory, its metrics directory, an experiment directory
// with one run, or an mlruns directory with one run. ok is false when dir
// is none of these.
func mlflowMetricsDir(dir string) (string, bool, error) {
	if isDir(filepath.Join(dir, "metrics")) && exists(filepath.Join(dir, "meta.yaml")) {
		return filepath.Join(dir, "metrics"), true, nil
	}
	if filepath.Base(dir) == "metrics" && exists(filepath.Join(filepath.Dir(dir), "meta.yaml")) {
		return dir, true, nil
	}
	// An experiment (mlruns/<exp>) or the store (mlruns): its runs are
	// <exp>/<run>/metrics one or two levels down.
	var runs []string
	for _, glob := range []string{"*/metrics", "*/*/metrics"} {
		found, err := filepath.Glob(filepath.Join(dir, glob))
		if err != nil {
			return "", false, err
		}
		for _, m := range found {
			if isDir(m) && exists(filepath.Join(filepath.Dir(m), "meta.yaml")) {
				runs = append(runs, filepath.Dir(m))
			}
		}
		if len(runs) > 0 {
			break
		}
	}
	switch len(runs) {
	case 0:
		return "", false, nil
	case 1:
		return filepath.Join(runs[0], "metrics"), true, nil
	}
	sort.Strings(runs)
	n, more := len(runs), ""
	if n > 3 {
		more = fmt.Sprintf(" and %d more", n-3)
		runs = runs[:3]
	}
	return "", true, fmt.Errorf("%s holds %d MLflow runs: pass one run's directory (%s%s)", dir, n, strings.Join(runs, ", "), more)
}

func isDir(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.IsDir()
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// mlflowKeys lists the metric keys under a run's metrics directory.
func mlflowKeys(dir string) ([]string, error) {
	var keys []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			rel, _ := filepath.Rel(dir, p)
			keys = append(keys, filepath.ToSlash(rel))
		}
		return nil
	})
	sort.Strings(keys)
	return keys, err
}

// pickMLflowKey chooses the metric: the one asked for, else a known
// training-loss name (lossColumns), else the only key trainingLoss
// accepts: with two such keys there is no telling which to read.
func pickMLflowKey(keys []string, metric string) (string, error) {
	if metric != "" {
		if slices.Contains(keys, metric) {
			return metric, nil
		}
		return "", fmt.Errorf("no metric %q (the run has %s)", metric, strings.Join(keys, ", "))
	}
	for _, want := range lossColumns {
		if slices.Contains(keys, want) {
			return want, nil
		}
	}
	var losses []string
	for _, k := range keys {
		if trainingLoss(k) {
			losses = append(losses, k)
		}
	}
	if len(losses) == 1 {
		return losses[0], nil
	}
	return "", fmt.Errorf("no training loss among the run's metrics (%s): name the one to read", strings.Join(keys, ", "))
}

// ReadMLflow reads one metric of an MLflow file-store run: metricsDir is
// the run's metrics directory.
func ReadMLflow(metricsDir, source string, opt Options) (*Series, error) {
	keys, err := mlflowKeys(metricsDir)
	if err != nil {
		return nil, fmt.Errorf("listing %s: %w", metricsDir, err)
	}
	key, err := pickMLflowKey(keys, opt.Metric)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	f, err := os.Open(filepath.Join(metricsDir, filepath.FromSlash(key)))
	if err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	defer f.Close()
	s, err := readMLflowFile(f, source, key)
	if err != nil {
		return nil, err
	}
	return s, nil
}

// readMLflowFile reads `<timestamp ms> <value> [<step>]` lines.
func readMLflowFile(r io.Reader, source, key string) (*Series, error) {
	s := &Series{Source: source, Metric: key, Format: "mlflow"}
	ln := newLines(r)
	for {
		line, where, err := ln.read(source, &s.Problems)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		f := bytes.Fields(line)
		if len(f) == 0 {
			continue
		}
		if len(f) < 2 || len(f) > 3 {
			s.Problems.Add(where.String(), "want `<timestamp ms> <value> <step>`")
			continue
		}
		ms, err1 := strconv.ParseInt(string(f[0]), 10, 64)
		v, err2 := strconv.ParseFloat(string(f[1]), 64)
		var step int64
		var err3 error
		if len(f) == 3 {
			step, err3 = strconv.ParseInt(string(f[2]), 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil || ms < 0 || ms > math.MaxInt64/1_000_000 || step > MaxStep || step < -MaxStep {
			s.Problems.Add(where.String(), "want `<timestamp ms> <value> <step>` (integers and a number)")
			continue
		}
		s.Points = append(s.Points, Point{Step: step, Value: v, Time: ms * 1e6})
	}
	if len(s.Points) == 0 {
		return nil, &EmptyError{Source: source, Metric: key, Problems: s.Problems}
	}
	s.Notes = append(s.Notes, fmt.Sprintf("read as an MLflow file store run: metric %q, %d line(s)", key, ln.n))
	s.Normalize()
	return s, nil
}
