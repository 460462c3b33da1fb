package metrics

import (
	"bytes"
	"fmt"
	"testing"
)

// BenchmarkReadJSONL reads a million-point JSONL run from memory.
func BenchmarkReadJSONL(b *testing.B) {
	var buf bytes.Buffer
	const n = 1_000_000
	for s := range n {
		fmt.Fprintf(&buf, `{"step":%d,"loss":%.6f,"ts":%d}`+"\n", s, 2-float64(s)/n, 1772352000+s)
	}
	data := buf.Bytes()
	b.SetBytes(int64(len(data)))
	b.ResetTimer()
	for b.Loop() {
		s, err := ReadJSONL(bytes.NewReader(data), "bench", Options{SizeHint: int64(len(data))})
		if err != nil || len(s.Points) != n {
			b.Fatalf("%v, %d points", err, len(s.Points))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/n, "ns/point")
}
