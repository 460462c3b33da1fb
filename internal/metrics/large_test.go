package metrics

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// sparse writes head, a hole up to size bytes, then tail: a 2 GB file
// that takes no disk.
func sparse(t *testing.T, path string, head string, size int64, tail string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(head); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt([]byte(tail), size-int64(len(tail))); err != nil {
		t.Fatal(err)
	}
}

// TestTwoGigabyteFiles reads 2 GiB files whose middle is a hole (NUL
// bytes, as a crashed writer or a preallocated file leaves): the readers
// stream them, keep the points on both sides, report the garbage, and do
// not size their buffers from the file size. Not parallel: it measures
// the bytes allocated.
func TestTwoGigabyteFiles(t *testing.T) {
	if testing.Short() {
		t.Skip("reads 2 GiB per case")
	}
	const size = 2 << 30
	dir := t.TempDir()
	var jsonl, csv strings.Builder
	csv.WriteString("epoch,step,train_loss\n")
	for s := 0; s < 5000; s++ {
		fmt.Fprintf(&jsonl, `{"step":%d,"loss":%g}`+"\n", s, 2/float64(s+1))
		fmt.Fprintf(&csv, "0,%d,%g\n", s, 2/float64(s+1))
	}
	var tb []byte
	tb = append(tb, tfrecord(fileVersion())...)
	for s := int64(0); s < 100; s++ {
		tb = append(tb, tfrecord(event(1772352000+float64(s), s, "train/loss", 1/float32(s+1), false))...)
	}
	tests := []struct {
		name, file, head, tail string
		wantPoints             int
		wantProblem            string
	}{
		{"jsonl", "big.jsonl", jsonl.String(), "\n" + `{"step":9999,"loss":0.5}` + "\n", 5001, "line 5001: line longer than 1 MiB"},
		{"csv", "big.csv", csv.String(), "\n0,9999,0.5\n", 5001, "line 5002: "},
		{"tensorboard", "events.out.tfevents.big", string(tb), "", 100, "length CRC mismatch: corrupt record framing, rest of file skipped"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, tc.file)
			sparse(t, path, tc.head, size, tc.tail)
			defer os.Remove(path)
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			s, err := ReadFile(path, Options{})
			runtime.ReadMemStats(&after)
			if err != nil {
				t.Fatal(err)
			}
			if len(s.Points) != tc.wantPoints || s.Problems.Count == 0 || !strings.Contains(s.Problems.String(), tc.wantProblem) {
				t.Errorf("%d points, problems %s; want %d points and %q", len(s.Points), s.Problems.String(), tc.wantPoints, tc.wantProblem)
			}
			// 5,001 points need well under a megabyte; sizing the slice
			// from the 2 GiB file size would take gigabytes.
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 256<<20 {
				t.Errorf("allocated %d MiB to read %d points", alloc>>20, len(s.Points))
			}
		})
	}
}

// TestReadCSVLines covers what parsing CSV line by line must keep: a BOM
// before the header, quoted fields, a quote left open (one bad line, not
// the rest of the file swallowed), blank lines and CRLF.
func TestReadCSVLines(t *testing.T) {
	t.Parallel()
	in := "\ufeffstep,\"train_loss\",note\r\n" +
		"1,\"2.5\",\"a, b\"\r\n" +
		"\r\n" +
		"2,\"1.5,open\n" +
		"3,1.0,x\n" +
		"4,0.5,\"x\"\"y\"\n"
	s, err := ReadCSV(strings.NewReader(in), "q.csv", Options{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Point{{Step: 1, Value: 2.5}, {Step: 3, Value: 1}, {Step: 4, Value: 0.5}}
	if d := cmp.Diff(want, s.Points); d != "" {
		t.Errorf("points (-want +got):\n%s", d)
	}
	if s.Problems.Count != 1 || s.Problems.First[0].Where != "line 4" {
		t.Errorf("problems %s, want one at line 4", s.Problems.String())
	}
}
