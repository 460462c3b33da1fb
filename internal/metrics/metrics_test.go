package metrics

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"google.golang.org/protobuf/encoding/protowire"
)

func ts(s string) int64 {
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		panic(err)
	}
	return t.UnixNano()
}

var nanEq = cmpopts.EquateNaNs()

func TestReadFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file         string
		wantFormat   string
		wantMetric   string
		want         []Point
		wantProblems []Problem
		wantCount    int
		wantRestarts int
		wantStart    int64
	}{
		{
			file: "run.jsonl", wantFormat: "jsonl", wantMetric: "loss",
			want: []Point{
				{0, 2.5, ts("2026-03-01T08:00:00Z")},
				{10, 2.0, ts("2026-03-01T08:00:10Z")},
				{20, 1.5, 1772352021500000000},
				{30, math.Inf(1), ts("2026-03-01T08:00:30Z")},
			},
			wantCount: 3,
			wantProblems: []Problem{
				{"line 3", "not a JSON object"},
				{"line 7", `"step": not a number: "x"`},
				{"line 9", "expected ',' or '}' at column 50"},
			},
		},
		{
			file: "train.log", wantFormat: "jsonl", wantMetric: "loss",
			want: []Point{
				{0, 2.4, ts("2026-03-01T08:00:00Z")},
				{5, 2.1, ts("2026-03-01T08:01:00Z")},
				{10, 1.8, ts("2026-03-01T08:01:05Z")},
			},
			wantCount:    1,
			wantProblems: []Problem{{"line 9", `"loss": expected a number at column 19`}},
			wantRestarts: 1,
			wantStart:    ts("2026-03-01T07:59:50Z"),
		},
		{
			file: "spool.jsonl", wantFormat: "jsonl", wantMetric: "loss",
			want: []Point{
				{1, 0.9, ts("2026-03-01T08:00:01Z")},
				{2, 0.8, ts("2026-03-01T08:00:05Z")},
				{3, math.Inf(-1), ts("2026-03-01T08:00:06Z")},
			},
			wantRestarts: 1,
		},
		{
			file: "metrics.csv", wantFormat: "csv", wantMetric: "train_loss",
			want:      []Point{{0, 2.5, 0}, {49, 2.1, 0}, {149, 1.5, 0}},
			wantCount: 2,
			wantProblems: []Problem{
				{"line 5", `train_loss "abc" is not a number`},
				{"line 6", "3 fields, header has 4"},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			t.Parallel()
			s, err := ReadFile(filepath.Join("testdata", tc.file), Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Format != tc.wantFormat || s.Metric != tc.wantMetric {
				t.Errorf("format %q metric %q, want %q %q", s.Format, s.Metric, tc.wantFormat, tc.wantMetric)
			}
			if d := cmp.Diff(tc.want, s.Points, nanEq); d != "" {
				t.Errorf("points (-want +got):\n%s", d)
			}
			if s.Problems.Count != tc.wantCount {
				t.Errorf("problem count %d, want %d", s.Problems.Count, tc.wantCount)
			}
			if d := cmp.Diff(tc.wantProblems, s.Problems.First); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
			if s.Restarts != tc.wantRestarts || s.Start != tc.wantStart {
				t.Errorf("restarts %d start %d, want %d %d", s.Restarts, s.Start, tc.wantRestarts, tc.wantStart)
			}
		})
	}
}

func TestReadErrors(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	tests := []struct {
		name, path string
		opt        Options
		want       string
	}{
		{"missing", filepath.Join(dir, "nope.jsonl"), Options{}, "no such file"},
		{"empty", write("empty.jsonl", ""), Options{}, "no loss values found"},
		{"all bad", write("bad.jsonl", "{\n{\"step\":1\nxx\n"), Options{}, "3 malformed (line 1:"},
		{"no step column", filepath.Join("testdata", "nostep.csv"), Options{}, `header has no "step" column`},
		{"unknown column", filepath.Join("testdata", "metrics.csv"), Options{Metric: "acc"}, `metric "acc": testdata/metrics.csv has no such column`},
		{"dir without events", dir, Options{}, "without TensorBoard event files"},
		{"long line", write("long.jsonl", strings.Repeat("x", maxLine+10)+"\n"), Options{}, "line 1: line longer than 1 MiB"},
		{"bad ts", write("ts.jsonl", `{"step":1,"loss":1,"ts":"yesterday"}`), Options{}, "neither RFC 3339"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, err := ReadFile(tc.path, tc.opt)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to contain %q", err, tc.want)
			}
		})
	}
}

// tfrecord frames data per the TFRecord format: length, masked CRC32C of
// the length, data, masked CRC32C of the data.
func tfrecord(data []byte) []byte {
	var b []byte
	b = binary.LittleEndian.AppendUint64(b, uint64(len(data)))
	b = binary.LittleEndian.AppendUint32(b, MaskedCRC(b[:8]))
	b = append(b, data...)
	return binary.LittleEndian.AppendUint32(b, MaskedCRC(data))
}

// event encodes an Event proto with one scalar, as simple_value
// (PyTorch's SummaryWriter) or as a float tensor (TF2).
func event(wall float64, step int64, tag string, v float32, asTensor bool) []byte {
	var val []byte
	val = protowire.AppendTag(val, valueTag, protowire.BytesType)
	val = protowire.AppendString(val, tag)
	if asTensor {
		var tensor []byte
		tensor = protowire.AppendTag(tensor, tensorDtype, protowire.VarintType)
		tensor = protowire.AppendVarint(tensor, dtFloat)
		tensor = protowire.AppendTag(tensor, tensorContent, protowire.BytesType)
		tensor = protowire.AppendBytes(tensor, binary.LittleEndian.AppendUint32(nil, math.Float32bits(v)))
		val = protowire.AppendTag(val, valueTensor, protowire.BytesType)
		val = protowire.AppendBytes(val, tensor)
	} else {
		val = protowire.AppendTag(val, valueSimpleValue, protowire.Fixed32Type)
		val = protowire.AppendFixed32(val, math.Float32bits(v))
	}
	var sum []byte
	sum = protowire.AppendTag(sum, summaryValue, protowire.BytesType)
	sum = protowire.AppendBytes(sum, val)
	var ev []byte
	ev = protowire.AppendTag(ev, eventWallTime, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wall))
	ev = protowire.AppendTag(ev, eventStep, protowire.VarintType)
	ev = protowire.AppendVarint(ev, uint64(step))
	ev = protowire.AppendTag(ev, eventSummary, protowire.BytesType)
	return protowire.AppendBytes(ev, sum)
}

func fileVersion() []byte {
	var ev []byte
	ev = protowire.AppendTag(ev, eventWallTime, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(1772352000))
	ev = protowire.AppendTag(ev, 3, protowire.BytesType)
	return protowire.AppendString(ev, "brain.Event:2")
}

func sessionStart(wall float64) []byte {
	var sl []byte
	sl = protowire.AppendTag(sl, sessionLogStatus, protowire.VarintType)
	sl = protowire.AppendVarint(sl, sessionLogStart)
	var ev []byte
	ev = protowire.AppendTag(ev, eventWallTime, protowire.Fixed64Type)
	ev = protowire.AppendFixed64(ev, math.Float64bits(wall))
	ev = protowire.AppendTag(ev, eventSessionLog, protowire.BytesType)
	return protowire.AppendBytes(ev, sl)
}

func TestReadTensorBoard(t *testing.T) {
	t.Parallel()
	good := [][]byte{
		tfrecord(fileVersion()),
		tfrecord(event(1772352000.5, 0, "train/loss", 2.5, false)),
		tfrecord(event(1772352001, 0, "val_loss", 9, false)),
		tfrecord(event(1772352010, 10, "train/loss", 2.0, true)),
		tfrecord(sessionStart(1772352015)),
		tfrecord(event(1772352020, 20, "train/loss", float32(math.NaN()), false)),
	}
	all := bytes.Join(good, nil)
	badData := bytes.Join(good, nil)
	// Flip a byte inside record 4's data: its data CRC no longer matches.
	off := len(good[0]) + len(good[1]) + len(good[2]) + 14
	badData[off] ^= 0xff
	badLen := bytes.Join(good, nil)
	badLen[len(good[0])+len(good[1])+len(good[2])] ^= 0x01

	second := 1e9
	tests := []struct {
		name         string
		data         []byte
		want         []Point
		wantProblems []Problem
		wantRestarts int
	}{
		{
			name: "good",
			data: all,
			want: []Point{
				{0, 2.5, int64(1772352000.5 * second)},
				{10, 2.0, 1772352010 * int64(second)},
				{20, math.NaN(), 1772352020 * int64(second)},
			},
			wantRestarts: 1,
		},
		{
			name: "truncated last record",
			data: all[:len(all)-7],
			want: []Point{
				{0, 2.5, int64(1772352000.5 * second)},
				{10, 2.0, 1772352010 * int64(second)},
			},
			wantProblems: []Problem{{"mem: record 6 at byte " + itoa(len(all)-len(good[5])), "truncated record (" + itoa(len(good[5])-12-7) + " of " + itoa(len(good[5])-12) + " bytes; file cut or still being written)"}},
			wantRestarts: 1,
		},
		{
			name: "truncated header",
			data: all[:len(all)-len(good[5])+5],
			want: []Point{
				{0, 2.5, int64(1772352000.5 * second)},
				{10, 2.0, 1772352010 * int64(second)},
			},
			wantProblems: []Problem{{"mem: record 6 at byte " + itoa(len(all)-len(good[5])), "truncated record header (5 of 12 bytes; file cut or still being written)"}},
			wantRestarts: 1,
		},
		{
			name: "bad data crc",
			data: badData,
			want: []Point{
				{0, 2.5, int64(1772352000.5 * second)},
				{20, math.NaN(), 1772352020 * int64(second)},
			},
			wantProblems: []Problem{{"mem: record 4 at byte " + itoa(len(good[0])+len(good[1])+len(good[2])), "data CRC mismatch: record skipped"}},
			wantRestarts: 1,
		},
		{
			name:         "bad length crc",
			data:         badLen,
			want:         []Point{{0, 2.5, int64(1772352000.5 * second)}},
			wantProblems: []Problem{{"mem: record 4 at byte " + itoa(len(good[0])+len(good[1])+len(good[2])), "length CRC mismatch: corrupt record framing, rest of file skipped"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, err := ReadTensorBoard(bytes.NewReader(tc.data), "mem", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Metric != "train/loss" {
				t.Errorf("metric %q, want train/loss", s.Metric)
			}
			if d := cmp.Diff(tc.want, s.Points, nanEq); d != "" {
				t.Errorf("points (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantProblems, s.Problems.First); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
			if s.Restarts != tc.wantRestarts {
				t.Errorf("restarts %d, want %d", s.Restarts, tc.wantRestarts)
			}
		})
	}
}

func TestTensorBoardDirectoryAndSniff(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f1 := bytes.Join([][]byte{tfrecord(fileVersion()), tfrecord(event(1772352000, 0, "loss", 3, false))}, nil)
	f2 := bytes.Join([][]byte{tfrecord(event(1772352010, 10, "loss", 2, false))}, nil)
	for name, b := range map[string][]byte{"events.out.tfevents.1.host": f1, "events.out.tfevents.2.host": f2} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	s, err := ReadFile(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]Point{{0, 3, 1772352000 * 1e9}, {10, 2, 1772352010 * 1e9}}, s.Points); d != "" {
		t.Errorf("directory (-want +got):\n%s", d)
	}
	// A renamed event file is recognised by its framing.
	renamed := filepath.Join(t.TempDir(), "run1.bin")
	if err := os.WriteFile(renamed, f1, 0o644); err != nil {
		t.Fatal(err)
	}
	s, err = ReadFile(renamed, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Format != "tensorboard" || len(s.Points) != 1 {
		t.Errorf("sniffed %s with %d points, want tensorboard with 1", s.Format, len(s.Points))
	}
	// No loss tag: the message lists the tags.
	noLoss := tfrecord(event(1, 1, "accuracy", 0.5, false))
	_, err = ReadTensorBoard(bytes.NewReader(noLoss), "acc", Options{})
	var ee *EmptyError
	if err == nil || errors.As(err, &ee) || !strings.Contains(err.Error(), "no loss tag among [accuracy]") {
		t.Errorf("error %v, want one listing the tags", err)
	}
}

func TestAlign(t *testing.T) {
	t.Parallel()
	mk := func(label string, steps []int64, vals []float64) *Series {
		s := &Series{Label: label}
		for i := range steps {
			s.Points = append(s.Points, Point{Step: steps[i], Value: vals[i]})
		}
		return s
	}
	tests := []struct {
		name      string
		a, b      *Series
		want      *Aligned
		wantError string
	}{
		{
			name: "same steps",
			a:    mk("a", []int64{0, 10, 20}, []float64{3, 2, 1}),
			b:    mk("b", []int64{0, 10, 20}, []float64{3.5, 2.5, 1.5}),
			want: &Aligned{Steps: []int64{0, 10, 20}, A: []float64{3, 2, 1}, B: []float64{3.5, 2.5, 1.5}, Note: "compared at 3 step(s) of a in 0..20"},
		},
		{
			name: "different intervals interpolate the denser",
			a:    mk("a", []int64{0, 5, 10, 15, 20}, []float64{4, 3, 2, 1, 0}),
			b:    mk("b", []int64{0, 7, 20}, []float64{4, 4, 0}),
			want: &Aligned{Steps: []int64{0, 7, 20}, A: []float64{4, 2.6, 0}, B: []float64{4, 4, 0}, Interpolated: 1,
				Note: "compared at 3 step(s) of b in 0..20; logging intervals differ: 1 value(s) of a interpolated linearly on step"},
		},
		{
			name: "partial overlap",
			a:    mk("a", []int64{0, 10, 20, 30}, []float64{4, 3, 2, 1}),
			b:    mk("b", []int64{20, 30, 40}, []float64{2, 1, 0}),
			want: &Aligned{Steps: []int64{20, 30}, A: []float64{2, 1}, B: []float64{2, 1}, Note: "compared at 2 step(s) of a in 20..30"},
		},
		{
			name:      "no overlap",
			a:         mk("us", []int64{0, 10}, []float64{1, 1}),
			b:         mk("eu", []int64{20, 30}, []float64{1, 1}),
			wantError: "us (steps 0..10) and eu (steps 20..30) have no steps in common",
		},
		{
			name: "single point",
			a:    mk("a", []int64{10}, []float64{1}),
			b:    mk("b", []int64{0, 20}, []float64{0, 2}),
			want: &Aligned{Steps: []int64{10}, A: []float64{1}, B: []float64{1}, Interpolated: 1, Note: "compared at 1 step(s) of a in 10..10; logging intervals differ: 1 value(s) of b interpolated linearly on step"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := Align(tc.a, tc.b)
			if tc.wantError != "" {
				if err == nil || err.Error() != tc.wantError {
					t.Fatalf("error %v, want %q", err, tc.wantError)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, got, cmpopts.EquateApprox(0, 1e-12)); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestNormalizeDuplicates(t *testing.T) {
	t.Parallel()
	s := &Series{Points: []Point{{0, 1, 0}, {10, 2, 0}, {20, 3, 0}, {10, 5, 0}, {20, 6, 0}, {30, 7, 0}}}
	s.Normalize()
	want := []Point{{0, 1, 0}, {10, 5, 0}, {20, 6, 0}, {30, 7, 0}}
	if d := cmp.Diff(want, s.Points); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
	if s.Restarts != 1 {
		t.Errorf("restarts %d, want 1", s.Restarts)
	}
	if d := cmp.Diff([]string{"steps went backwards 1 time(s) (counted as restarts); sorted by step", "2 repeated step(s): kept the last logged value"}, s.Notes); d != "" {
		t.Errorf("notes (-want +got):\n%s", d)
	}
}

// TestRestartAt: where a run restarted, for the chart's marks: with
// restart events, where they are (as Restarts counts them, not the step
// jumps); without, each step jump, listed only up to MaxRestartAt for a
// log that jumps back at every line.
func TestRestartAt(t *testing.T) {
	t.Parallel()
	log := `{"step":10,"loss":1}
{"step":20,"loss":NaN}
{"event":"restart"}
{"step":10,"loss":1.1}
{"step":20,"loss":0.9}
{"step":30,"loss":0.8}
{"step":25,"loss":0.85}
{"step":40,"loss":0.7}
`
	s, err := ReadJSONL(strings.NewReader(log), "r.jsonl", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]Restart{{After: 20, Resume: 10, NonFinite: true}}, s.RestartAt); d != "" {
		t.Errorf("restarts (-want +got):\n%s", d)
	}
	// The agent's own log of a NaN restart: no restart event, the
	// attempt (process start) goes up, and the step logged NaN is logged
	// again from the checkpoint. It was counted, not placed, so the
	// chart showed nothing where the run restarted.
	agentLog := `{"step":50,"ts":"2026-12-06T15:08:16Z","attempt":1,"values":{"loss":0.03}}
{"step":51,"ts":"2026-12-06T15:08:16Z","attempt":1,"values":{"loss":"NaN"}}
{"step":51,"ts":"2026-12-06T15:08:17Z","attempt":2,"values":{"loss":0.029}}
{"step":52,"ts":"2026-12-06T15:08:17Z","attempt":2,"values":{"loss":0.028}}
`
	s, err = ReadJSONL(strings.NewReader(agentLog), "agent.jsonl", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]Restart{{After: 51, Resume: 51, NonFinite: true}}, s.RestartAt); d != "" || s.Restarts != 1 {
		t.Errorf("%d restarts; placed (-want +got):\n%s", s.Restarts, d)
	}
	var pts []Point
	for i := range 1000 {
		pts = append(pts, Point{Step: int64(1000 - i), Value: 1})
	}
	many := &Series{Points: pts}
	many.Normalize()
	if many.Restarts != 999 || len(many.RestartAt) != MaxRestartAt {
		t.Errorf("%d restarts, %d listed; want 999 and %d", many.Restarts, len(many.RestartAt), MaxRestartAt)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

// TestTimeRange: Unix nanoseconds in an int64 end in 2262; times past it
// (or before 1678) are problems, not times wrapped into another century.
func TestTimeRange(t *testing.T) {
	t.Parallel()
	const lastSecond = 9223372036 // 2262-04-11T23:47:16Z
	tests := []struct {
		name, format, body string
		want               []Point
		wantProblems       []Problem
	}{
		{
			name: "jsonl epoch", format: "jsonl",
			body: `{"step":1,"loss":1,"ts":9223372036}` + "\n" + `{"step":2,"loss":1,"ts":9300000000}` + "\n" + `{"step":3,"loss":1,"ts":"99999999999"}` + "\n",
			want: []Point{{1, 1, lastSecond * 1e9}},
			wantProblems: []Problem{
				{"line 2", `"ts": epoch seconds 9.3e+09 out of range`},
				{"line 3", `"ts": epoch seconds 9.9999999999e+10 out of range`},
			},
		},
		{
			name: "jsonl rfc 3339", format: "jsonl",
			body: `{"step":1,"loss":1,"ts":"2262-04-11T23:47:16Z"}` + "\n" + `{"step":2,"loss":1,"ts":"2300-01-01T00:00:00Z"}` + "\n" + `{"step":3,"loss":1,"time":"1600-01-01T00:00:00+01:00"}` + "\n",
			want: []Point{{1, 1, lastSecond * 1e9}},
			wantProblems: []Problem{
				{"line 2", `"ts": time "2300-01-01T00:00:00Z" out of range (years 1678 to 2262)`},
				{"line 3", `"time": time "1600-01-01T00:00:00+01:00" out of range (years 1678 to 2262)`},
			},
		},
		{
			name: "csv", format: "csv",
			body: "step,loss,time\n1,1,2262-04-11T23:47:16Z\n2,1,2300-01-01T00:00:00Z\n3,1,9300000000\n",
			want: []Point{{1, 1, lastSecond * 1e9}},
			wantProblems: []Problem{
				{"line 3", `time "2300-01-01T00:00:00Z" out of range (years 1678 to 2262)`},
				{"line 4", `epoch seconds 9.3e+09 out of range`},
			},
		},
		{
			// An unusable wall time leaves the time unknown, as before.
			name: "tensorboard wall_time", format: "tensorboard",
			body: string(bytes.Join([][]byte{
				tfrecord(event(lastSecond, 1, "loss", 1, false)),
				tfrecord(event(9.3e9, 2, "loss", 1, false)),
				tfrecord(event(5e10, 3, "loss", 1, false)),
			}, nil)),
			want: []Point{{1, 1, lastSecond * 1e9}, {2, 1, 0}, {3, 1, 0}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			read := map[string]func(io.Reader, string, Options) (*Series, error){
				"jsonl": ReadJSONL, "csv": ReadCSV, "tensorboard": ReadTensorBoard,
			}[tc.format]
			s, err := read(strings.NewReader(tc.body), "mem", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, s.Points); d != "" {
				t.Errorf("points (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tc.wantProblems, s.Problems.First); d != "" {
				t.Errorf("problems (-want +got):\n%s", d)
			}
		})
	}
}

// TestTensorBoardKeepsOneTag: a file with many tags (per-layer gradient
// norms) holds the points of one tag in memory, not of all. The heap is
// measured while ReadTensorBoardFiles opens its second file, after it
// read the first. Not parallel: other tests would allocate meanwhile.
func TestTensorBoardKeepsOneTag(t *testing.T) {
	const steps, layers = 1000, 20
	var file, lossOnly, layerOnly []byte
	for step := range int64(steps) {
		wall := 1772352000 + float64(step)
		loss := tfrecord(event(wall, step, "train/loss", float32(step), false))
		file = append(file, loss...)
		lossOnly = append(lossOnly, loss...)
		for l := range layers {
			tag := "grad_norm/layer" + itoa(l)
			g := tfrecord(event(wall, step, tag, float32(step*100+int64(l)), l%2 == 0))
			file = append(file, g...)
			if l == 7 {
				layerOnly = append(layerOnly, g...)
			}
		}
	}
	// A point is 24 bytes; the slice holding steps of them may have
	// grown to twice that, and twice again leaves room for the rest.
	// All tags' points would be 21 times as many.
	const bound = 4 * steps * 24
	for _, tc := range []struct {
		opt  Options
		only []byte
	}{
		{Options{}, lossOnly},
		{Options{Metric: "grad_norm/layer7"}, layerOnly},
	} {
		want, err := ReadTensorBoard(bytes.NewReader(tc.only), "mem", tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		var before, during runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		open := func(name string) (io.ReadCloser, error) {
			if name == "second" {
				runtime.GC()
				runtime.ReadMemStats(&during)
				return io.NopCloser(strings.NewReader("")), nil
			}
			return io.NopCloser(bytes.NewReader(file)), nil
		}
		got, err := ReadTensorBoardFiles(open, []string{"first", "second"}, "mem", tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		if got.Metric != want.Metric || !cmp.Equal(got.Points, want.Points) {
			t.Errorf("%+v: got %s %v, want %s %v", tc.opt, got.Metric, got.Points, want.Metric, want.Points)
		}
		if held := int64(during.HeapAlloc) - int64(before.HeapAlloc); held > bound {
			t.Errorf("%+v: %d bytes held after reading %d points of %d tags, want at most %d", tc.opt, held, len(want.Points), layers+1, bound)
		}
	}
}

// TestCSVSkipsHeldOutLoss: a CSV without a known loss column reads the
// first training loss, not an evaluation loss before it.
func TestCSVSkipsHeldOutLoss(t *testing.T) {
	t.Parallel()
	s, err := ReadCSV(strings.NewReader("step,eval_loss,aux_loss\n1,9,2\n"), "mem.csv", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if s.Metric != "aux_loss" || len(s.Points) != 1 || s.Points[0].Value != 2 {
		t.Errorf("metric %q, points %v; want aux_loss, 2", s.Metric, s.Points)
	}
}

// TestTensorBoardPicksLossAsTagsAppear: the loss tag is chosen while
// reading, so a better tag appearing later still wins, with all of its
// points, as pickLoss would choose among all tags.
func TestTensorBoardPicksLossAsTagsAppear(t *testing.T) {
	t.Parallel()
	tests := []struct {
		tags []string
		want string
	}{
		{[]string{"aux_loss", "grad_norm", "loss_step", "train_loss", "loss"}, "loss"},
		{[]string{"val_loss", "Aux_Loss", "test_loss", "extra_loss"}, "Aux_Loss"},
		{[]string{"loss_step", "train/loss", "train_loss_step"}, "train_loss_step"},
		// Held-out losses by any of their names are skipped; a name that
		// merely starts with "val" is not one.
		{[]string{"eval/loss", "valid_loss", "train_val_loss", "value_loss"}, "value_loss"},
	}
	for _, tc := range tests {
		t.Run(tc.want, func(t *testing.T) {
			t.Parallel()
			var b []byte
			for step := range int64(3) {
				for i, tag := range tc.tags {
					b = append(b, tfrecord(event(1772352000, step, tag, float32(10*step)+float32(i), false))...)
				}
			}
			s, err := ReadTensorBoard(bytes.NewReader(b), "mem", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if want := pickLoss(tc.tags); s.Metric != tc.want || want != tc.want {
				t.Fatalf("metric %q, pickLoss %q, want %q", s.Metric, want, tc.want)
			}
			i := float64(slices.Index(tc.tags, tc.want))
			want := []Point{{0, i, 1772352000e9}, {1, 10 + i, 1772352000e9}, {2, 20 + i, 1772352000e9}}
			if d := cmp.Diff(want, s.Points); d != "" {
				t.Errorf("points (-want +got):\n%s", d)
			}
		})
	}
}

// TestCSVHeaderSpaces: header names are trimmed before the loss column is
// picked, as they are for the lookups.
func TestCSVHeaderSpaces(t *testing.T) {
	t.Parallel()
	s, err := ReadCSV(strings.NewReader("step, train_loss ,epoch\n1, 2.5,0\n2, 2,0\n"), "mem", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff([]Point{{1, 2.5, 0}, {2, 2, 0}}, s.Points); s.Metric != "train_loss" || d != "" {
		t.Errorf("metric %q, want train_loss; points (-want +got):\n%s", s.Metric, d)
	}
}
