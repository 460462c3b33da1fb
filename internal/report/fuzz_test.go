package report

import (
	"encoding/binary"
	"io"
	"math"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/metrics"
)

// FuzzBuild turns arbitrary bytes into up to three series (steps within
// the readers' bounds, any float including NaN/Inf) and renders them all:
// no input may panic a renderer.
func FuzzBuild(f *testing.F) {
	f.Add([]byte{1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 240, 63, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 248, 127})
	f.Fuzz(func(t *testing.T, b []byte) {
		series := []*metrics.Series{{Label: "a"}, {Label: "b"}, {Label: "c"}}
		for i := 0; i+16 <= len(b); i += 16 {
			s := series[(i/16)%3]
			step := int64(binary.LittleEndian.Uint64(b[i:])) % metrics.MaxStep
			v := math.Float64frombits(binary.LittleEndian.Uint64(b[i+8:]))
			s.Points = append(s.Points, metrics.Point{Step: step, Value: v, Time: int64(i)})
		}
		var in []*metrics.Series
		for _, s := range series {
			if len(s.Points) > 0 {
				s.Normalize()
				in = append(in, s)
			}
		}
		if len(in) == 0 {
			return
		}
		r, err := Build(in, Tolerance{Abs: 0.1, HasAbs: true, Rel: 0.1, HasRel: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, render := range []func(io.Writer, *Report) error{Markdown, SVG, PNG, JSON, JUnit} {
			if err := render(io.Discard, r); err != nil {
				t.Fatal(err)
			}
		}
		// Mermaid cannot parse NaN or Inf: the chart must hold none.
		var md strings.Builder
		Markdown(&md, r)
		if _, chart, ok := strings.Cut(md.String(), "xychart-beta"); ok {
			chart, _, _ = strings.Cut(chart, "```")
			if strings.Contains(chart, "NaN") || strings.Contains(chart, "Inf") {
				t.Fatalf("non-finite value in the Mermaid chart:\n%s", chart)
			}
		}
	})
}
