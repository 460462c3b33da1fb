package metrics

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ReadFile reads a metric file, choosing the reader by name and content:
// a directory or a name containing "tfevents" is TensorBoard, ".csv" is a
// CSVLogger file, anything else is gpupass JSONL or a log with
// gpupass:metric lines. Files are streamed, never read whole.
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
			return nil, fmt.Errorf("%s is a directory without TensorBoard event files (events.out.tfevents.*)", path)
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
	return ReadJSONL(f, path, opt)
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}
