package events

import (
	"encoding/json"
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

var update = flag.Bool("update", false, "rewrite golden files")

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden (run with -update): %v", err)
	}
	if d := cmp.Diff(string(want), string(got)); d != "" {
		t.Errorf("%s mismatch (-want +got):\n%s", name, d)
	}
}

var ts = time.Date(2024, 4, 12, 8, 23, 15, 221_987_000, time.UTC)

func sampleEvents() []Event {
	return []Event{
		{Seq: 1, Time: ts, Level: Info, Component: RuntimeInit, Message: "CUDA driver 535.104.05 loaded (expected 535.104.05)"},
		{Seq: 2, Time: ts.Add(time.Second), Level: Error, Component: NaNGuard, Message: "non-finite loss NaN at step 60",
			Fields: map[string]string{"step": "60", "resume_from": "/w/ckpt 50.pt", "empty": ""}},
		{Seq: 3, Time: ts.Add(2 * time.Second), Level: Warn, Component: StderrComponent, Message: "tab\there \"quoted\"\nsecond line"},
	}
}

func TestTextAndJSONGolden(t *testing.T) {
	t.Parallel()
	var text, js strings.Builder
	for _, e := range sampleEvents() {
		text.WriteString(e.Text() + "\n")
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		js.Write(append(b, '\n'))
	}
	golden(t, "events.txt", []byte(text.String()))
	golden(t, "events.jsonl", []byte(js.String()))
}

func TestJSONRoundTrip(t *testing.T) {
	t.Parallel()
	for _, e := range sampleEvents() {
		b, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		var got Event
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatal(err)
		}
		want := e
		want.Time = e.Time.Truncate(time.Millisecond)
		if d := cmp.Diff(want, got); d != "" {
			t.Errorf("round trip (-want +got):\n%s", d)
		}
	}
}

func TestParseLevel(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]Level{"debug": Debug, "INFO": Info, "Warning": Warn, "WARN": Warn, "critical": Error, "FATAL": Error} {
		got, err := ParseLevel(in)
		if err != nil || got != want {
			t.Errorf("ParseLevel(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	if _, err := ParseLevel("loud"); err == nil || !strings.Contains(err.Error(), "use DEBUG, INFO, WARN or ERROR") {
		t.Errorf("ParseLevel(loud) error = %v", err)
	}
}

func TestClassify(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		stream Stream
		lines  []string
		want   []Class
	}{
		{"example script prefixes", Stdout,
			[]string{"dataloader: generating 4096 samples (seed 1234) on cpu", "trainer: step 50 loss 0.1", "checkpoint: saved /x/ckpt-00000025.pt"},
			[]Class{{Info, "dataloader", "generating 4096 samples (seed 1234) on cpu"}, {Info, "trainer", "step 50 loss 0.1"}, {Info, "checkpoint", "saved /x/ckpt-00000025.pt"}}},
		{"plain lines take the stream", Stdout, []string{"hello world", "Epoch 1: 100%"},
			[]Class{{Info, "stdout", "hello world"}, {Info, "stdout", "Epoch 1: 100%"}}},
		{"stderr defaults to WARN", Stderr, []string{"something odd", "trainer: non-finite loss nan at step 5"},
			[]Class{{Warn, "stderr", "something odd"}, {Warn, "trainer", "non-finite loss nan at step 5"}}},
		{"python logging format", Stderr, []string{"INFO:torch.distributed:rank 0 ready", "WARNING:root:careful", "ERROR:trainer:boom"},
			[]Class{{Info, "torch.distributed", "rank 0 ready"}, {Warn, "root", "careful"}, {Error, "trainer", "boom"}}},
		{"level words", Stdout, []string{"ERROR checkpoint: disk full", "[WARN] slow step", "error: bad flag", "INFO: ready"},
			[]Class{{Error, "checkpoint", "disk full"}, {Warn, "stdout", "slow step"}, {Error, "stdout", "bad flag"}, {Info, "stdout", "ready"}}},
		{"traceback", Stderr, []string{
			"Traceback (most recent call last):",
			`  File "train.py", line 3, in <module>`,
			"    main()",
			"ValueError: bad shape",
			"after the traceback",
		}, []Class{
			{Error, "stderr", "Traceback (most recent call last):"},
			{Error, "stderr", `  File "train.py", line 3, in <module>`},
			{Error, "stderr", "    main()"},
			{Error, "stderr", "ValueError: bad shape"},
			{Warn, "stderr", "after the traceback"},
		}},
		{"exceptions and warnings outside a traceback", Stdout,
			[]string{"torch.cuda.OutOfMemoryError: CUDA out of memory", "/x/y.py:12: UserWarning: deprecated", "KeyboardInterrupt"},
			[]Class{{Error, "stdout", "torch.cuda.OutOfMemoryError: CUDA out of memory"}, {Warn, "stdout", "/x/y.py:12: UserWarning: deprecated"}, {Error, "stdout", "KeyboardInterrupt"}}},
		{"not a component", Stdout, []string{"Note: capitalised", "http://example: x", "a-very-long-component-name-that-is-over-forty-chars: x"},
			[]Class{{Info, "stdout", "Note: capitalised"}, {Info, "stdout", "http://example: x"}, {Info, "stdout", "a-very-long-component-name-that-is-over-forty-chars: x"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &Classifier{Stream: tt.stream}
			var got []Class
			for _, l := range tt.lines {
				got = append(got, c.Classify(l))
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

func TestParseMetric(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	tests := []struct {
		line    string
		want    Metric
		wantErr string
	}{
		{`{"step":1,"loss":0.5,"lr":0.05,"ts":"2026-01-02T03:04:05.123Z"}`,
			Metric{Step: 1, Time: now.Add(123 * time.Millisecond), Values: map[string]float64{"loss": 0.5, "lr": 0.05}}, ""},
		{`gpupass:metric {"step": 7, "loss": NaN, "grad": Infinity, "g2": -Infinity, "note": "NaN in a string is a string"}`,
			Metric{Step: 7, Time: now, Values: map[string]float64{"loss": math.NaN(), "grad": math.Inf(1), "g2": math.Inf(-1)}}, ""},
		{`{"step":3.0,"acc":1,"ok":true,"nested":{"a":1},"time":1700000000.5}`,
			Metric{Step: 3, Time: time.Unix(1700000000, 500_000_000).UTC(), Values: map[string]float64{"acc": 1}}, ""},
		{`{"loss":1}`, Metric{}, `no integer "step"`},
		{`{"step":1.5,"loss":1}`, Metric{}, `no integer "step"`},
		{`{"step":"1"}`, Metric{}, `no integer "step"`},
		{`step=1 loss=2`, Metric{}, "not a JSON object"},
		{`{"step":1,"loss":}`, Metric{}, "not a JSON object"},
		// Steps are bounded as the compare report bounds them (2^53).
		{`{"step":9007199254740992,"loss":1}`, Metric{Step: 1 << 53, Time: now, Values: map[string]float64{"loss": 1}}, ""},
		{`{"step":-9007199254740992,"loss":1}`, Metric{Step: -1 << 53, Time: now, Values: map[string]float64{"loss": 1}}, ""},
		{`{"step":9007199254740993,"loss":1}`, Metric{}, `no integer "step": 9007199254740993 out of range`},
		{`{"step":9223372036854775807,"loss":1}`, Metric{}, `no integer "step": 9223372036854775807 out of range`},
		{`{"step":-9223372036854775808,"loss":1}`, Metric{}, `out of range`},
		{`{"step":1e17,"loss":1}`, Metric{}, `no integer "step": 1e17 out of range`},
		// Times an int64 of Unix nanoseconds cannot hold are not
		// times: the line keeps the time it was read at.
		{`{"step":1,"loss":1,"ts":9999999999}`, Metric{Step: 1, Time: now, Values: map[string]float64{"loss": 1}}, ""},
		{`{"step":1,"loss":1,"ts":"2300-01-01T00:00:00Z"}`, Metric{Step: 1, Time: now, Values: map[string]float64{"loss": 1}}, ""},
		{`{"step":1,"loss":1,"ts":9000000000}`, Metric{Step: 1, Time: time.Unix(9000000000, 0).UTC(), Values: map[string]float64{"loss": 1}}, ""},
		// The first usable of ts, time and timestamp wins.
		{`{"step":1,"timestamp":1,"time":"2026-01-02T03:04:06Z","ts":"yesterday"}`,
			Metric{Step: 1, Time: now.Add(time.Second), Values: map[string]float64{}}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.line, func(t *testing.T) {
			t.Parallel()
			got, err := ParseMetric([]byte(tt.line), now)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error = %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// "note" held the string "NaN in a string is a string", which is not a token.
			if d := cmp.Diff(tt.want, got, cmpopts.EquateNaNs()); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
		})
	}
}

// TestParseMetricTimeKeys: with several time keys the same one wins every
// time, however the decoded map is iterated.
func TestParseMetricTimeKeys(t *testing.T) {
	t.Parallel()
	line := []byte(`{"step":1,"timestamp":1700000002,"time":1700000001,"loss":1,"ts":1700000000}`)
	want := time.Unix(1700000000, 0).UTC()
	for range 200 {
		m, err := ParseMetric(line, time.Time{})
		if err != nil {
			t.Fatal(err)
		}
		if !m.Time.Equal(want) {
			t.Fatalf("time %v, want %v (from \"ts\")", m.Time, want)
		}
	}
}

func TestMetricJSONRoundTrip(t *testing.T) {
	t.Parallel()
	m := Metric{Seq: 9, Step: 4, Time: ts.Truncate(time.Millisecond), Attempt: 2, Source: "file",
		Values: map[string]float64{"loss": math.NaN(), "up": math.Inf(1), "down": math.Inf(-1), "lr": 0.1}}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	var got Metric
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if d := cmp.Diff(m, got, cmpopts.EquateNaNs()); d != "" {
		t.Errorf("round trip (-want +got):\n%s", d)
	}
}

func TestContinuous(t *testing.T) {
	t.Parallel()
	p := func(attempt int, step int64, loss float64) Metric {
		return Metric{Attempt: attempt, Step: step, Values: map[string]float64{"loss": loss}}
	}
	// Attempt 1 reaches step 6 and goes NaN; attempt 2 resumes from the
	// checkpoint at step 4 and finishes at 8.
	in := []Metric{p(1, 1, 1), p(1, 2, .9), p(1, 3, .8), p(1, 4, .7), p(1, 5, .6), p(1, 6, math.NaN()),
		p(2, 5, .61), p(2, 6, .51), p(2, 7, .41), p(2, 8, .31)}
	want := []Metric{p(1, 1, 1), p(1, 2, .9), p(1, 3, .8), p(1, 4, .7), p(2, 5, .61), p(2, 6, .51), p(2, 7, .41), p(2, 8, .31)}
	if d := cmp.Diff(want, Continuous(in), cmpopts.EquateNaNs()); d != "" {
		t.Errorf("(-want +got):\n%s", d)
	}
}

// TestAppendJSONMatchesEncodingJSON: the hand-written encoder must write
// what encoding/json would, for any text a process can print.
func TestAppendJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, msg := range []string{"plain", `quote " and \ backslash`, "tab\t nl\n cr\r", "<html> & co", "ünïcödé ✓", "\x00\x1f\x7f", "\uFFFD", "\u2028 line sep"} {
		e := Event{Seq: 3, Time: ts, Level: Warn, Component: "c<>", Message: msg, Fields: map[string]string{"k\"": msg, "a": "1"}}
		got := e.AppendJSON(nil)
		want, err := json.Marshal(eventJSON{e.Seq, e.Time.UTC().Format(JSONTimeLayout), e.Level, e.Component, e.Message, e.Fields})
		if err != nil {
			t.Fatal(err)
		}
		if string(got) != string(want) {
			t.Errorf("message %q:\n got %s\nwant %s", msg, got, want)
		}
	}
}
