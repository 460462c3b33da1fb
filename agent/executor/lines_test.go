package executor

import (
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/events"
)

// oneByteReader returns one byte per Read, to exercise chunk boundaries.
type oneByteReader struct{ s string }

func (r *oneByteReader) Read(p []byte) (int, error) {
	if r.s == "" {
		return 0, io.EOF
	}
	p[0] = r.s[0]
	r.s = r.s[1:]
	return 1, nil
}

func TestReadLines(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		in      string
		maxLine int
		want    []Line
	}{
		{"plain", "a\nbb\n\nccc", 10, []Line{{Text: "a"}, {Text: "bb"}, {Text: ""}, {Text: "ccc"}}},
		{"crlf", "a\r\nb\r\n", 10, []Line{{Text: "a"}, {Text: "b"}}},
		{"long line cut", "0123456789abcdef\nok\n", 10, []Line{{Text: "0123456789", Cut: 6}, {Text: "ok"}}},
		{"invalid utf-8 replaced", "ok \xff\xfe end\n", 100, []Line{{Text: "ok \uFFFD end", InvalidUTF8: true}}},
		// "é" is two bytes; a cut after its first byte is the cut's
		// doing, not bad input.
		{"cut keeps whole runes", "abcé" + "xyz\n", 4, []Line{{Text: "abc", Cut: 5}}},
		{"binary without newline", strings.Repeat("\x00\x01", 50), 8, []Line{{Text: "\x00\x01\x00\x01\x00\x01\x00\x01", Cut: 92}}},
	}
	for _, tt := range tests {
		for _, slow := range []bool{false, true} {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				var got []Line
				var r interface{ Read([]byte) (int, error) } = strings.NewReader(tt.in)
				if slow {
					r = &oneByteReader{tt.in}
				}
				if err := ReadLines(r, events.Stderr, tt.maxLine, func(l Line) { got = append(got, l) }); err != nil {
					t.Fatal(err)
				}
				want := append([]Line(nil), tt.want...)
				for i := range want {
					want[i].Stream = events.Stderr
				}
				if d := cmp.Diff(want, got); d != "" {
					t.Errorf("slow=%v (-want +got):\n%s", slow, d)
				}
			})
		}
	}
}

func TestOutputLimiter(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name         string
		lim          OutputLimits
		lines        int // at 100 lines per 100 ms of the fake clock
		size         int // bytes of records per line
		wantAdmitted int
		wantNotices  []string // in order, admit/charge/finish together
	}{
		{"no limits", OutputLimits{}, 5000, 100, 5000, nil},
		{"under both", OutputLimits{LinesPerSecond: 1000, MaxBytes: 1 << 20}, 900, 100, 900, nil},
		{"rate", OutputLimits{LinesPerSecond: 300}, 2000, 100, 600,
			[]string{"run printed more than 300 lines/s; 700 lines dropped", "run printed more than 300 lines/s; 700 lines dropped"}},
		{"bytes", OutputLimits{MaxBytes: 1 << 20}, 20000, 100, 10485,
			[]string{"run reached its log limit of 1 MB: further output dropped (the run goes on)", "9515 lines printed after the log limit of 1 MB were dropped"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			o := newOutputLimiter(tc.lim)
			var notices []string
			admitted := 0
			for i := 0; i < tc.lines; i++ {
				if o == nil {
					admitted++
					continue
				}
				ok, n := o.admit(t0.Add(time.Duration(i/100) * 100 * time.Millisecond))
				if n != nil {
					notices = append(notices, n.msg)
				}
				if !ok {
					continue
				}
				ok, n = o.charge(tc.size)
				if n != nil {
					notices = append(notices, n.msg)
				}
				if ok {
					admitted++
				}
			}
			if o != nil {
				for _, n := range o.finish() {
					notices = append(notices, n.msg)
				}
			}
			if admitted != tc.wantAdmitted || !slices.Equal(notices, tc.wantNotices) {
				t.Errorf("admitted %d lines, notices %q; want %d, %q", admitted, notices, tc.wantAdmitted, tc.wantNotices)
			}
		})
	}
}
