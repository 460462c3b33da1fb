package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ReadFile reads a metric file, choosing the reader by name and content:
// a directory is TensorBoard (event files in it) or an MLflow file-store
// run (mlruns/<experiment>/<run>, or a directory holding one such run);
// a name containing "tfevents" is TensorBoard, ".csv" is a CSVLogger
// file, a file in an MLflow run's metrics directory is that metric;
// anything else is gpupass JSONL or a log with gpupass:metric lines, and
// failing that a plain-text training log (ReadTextLog). With
// opt.Pattern, a file that is not TensorBoard, CSV or MLflow is read as
// a text log with it. Files are streamed, never read whole.
func ReadFile(path string, opt Options) (*Series, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	if fi.IsDir() {
		names, err := filepath.Glob(filepath.Join(path, "events.out.tfevents*"))
		if err != nil {
			return nil, fmt.Errorf("listing %s: %w", path, err)
		}
		if len(names) == 0 {
			mdir, ok, err := mlflowMetricsDir(path)
			if err != nil {
				return nil, err
			}
			if ok {
				return ReadMLflow(mdir, path, opt)
			}
			return nil, fmt.Errorf("%s is a directory without TensorBoard event files (events.out.tfevents.*) or an MLflow run (mlruns/<experiment>/<run>/metrics)", path)
		}
		sort.Strings(names)
		open := func(n string) (io.ReadCloser, error) {
			f, err := os.Open(n)
			if err != nil {
				return nil, fmt.Errorf("reading metrics: %w", err)
			}
			return f, nil
		}
		return ReadTensorBoardFiles(open, names, path, opt)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("reading metrics: %w", err)
	}
	defer f.Close()
	opt.SizeHint = fi.Size()
	base := strings.ToLower(filepath.Base(path))
	switch {
	case strings.Contains(base, "tfevents"):
		return ReadTensorBoard(f, path, opt)
	case strings.HasSuffix(base, ".csv"):
		return ReadCSV(f, path, opt)
	}
	if dir := filepath.Dir(path); filepath.Base(dir) == "metrics" && exists(filepath.Join(filepath.Dir(dir), "meta.yaml")) {
		if opt.Metric != "" && opt.Metric != filepath.Base(path) {
			return nil, fmt.Errorf("%s is MLflow's metric %q, not %q: pass the run's directory, %s", path, filepath.Base(path), opt.Metric, filepath.Dir(dir))
		}
		return readMLflowFile(f, path, filepath.Base(path))
	}
	// Sniff: a TFRecord starts with a length whose CRC matches.
	var head [12]byte
	n, _ := io.ReadFull(f, head[:])
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, fmt.Errorf("reading %s: %w", path, err)
	}
	if n == 12 && MaskedCRC(head[:8]) == le32(head[8:12]) {
		return ReadTensorBoard(f, path, opt)
	}
	if n > 0 && bytes.HasPrefix(bytes.TrimLeft(head[:n], "\ufeff"), []byte("epoch,")) || bytes.HasPrefix(head[:n], []byte("step,")) {
		return ReadCSV(f, path, opt)
	}
	if opt.Pattern != nil {
		return ReadTextLog(f, path, opt)
	}
	s, err := ReadJSONL(f, path, opt)
	var empty *EmptyError
	if !errors.As(err, &empty) {
		return s, err
	}
	if jsonProblems(empty.Problems) {
		// Broken JSON metric lines say more than "no loss lines".
		return nil, err
	}
	// No JSON metric lines: a log of a script that prints its own way.
	// Its non-JSON lines were ordinary output, not problems.
	if _, serr := f.Seek(0, io.SeekStart); serr != nil {
		return nil, fmt.Errorf("reading %s: %w", path, serr)
	}
	return ReadTextLog(f, path, opt)
}

// jsonProblems says whether some problem is a broken JSON metric line
// rather than a line that is no JSON at all.
func jsonProblems(p Problems) bool {
	for _, pr := range p.First {
		if pr.Reason != errNotJSON {
			return true
		}
	}
	return false
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
