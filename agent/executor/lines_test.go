package executor

import (
	"io"
	"strings"
	"testing"

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
				if err := readLines(r, events.Stderr, tt.maxLine, func(l Line) { got = append(got, l) }); err != nil {
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
