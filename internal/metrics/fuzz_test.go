package metrics

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"
)

// The readers take untrusted files: whatever the bytes, they return a
// series or an error, never panic.

func FuzzReadJSONL(f *testing.F) {
	f.Add([]byte(`{"step":1,"loss":NaN,"ts":"2026-01-01T00:00:00+01:00"}` + "\n" + `gpupass:metric {"step":2,"name":"loss","value":1}`))
	f.Add([]byte(`{"step":1e3,"loss":"inf","x":{"a":[1,"]"]}}`))
	f.Add([]byte(`{"step":-,"loss":}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		ReadJSONL(bytes.NewReader(b), "fuzz", Options{})
	})
}

func FuzzReadCSV(f *testing.F) {
	f.Add([]byte("epoch,step,train_loss\n0,1,2\n0,\"2\",x\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		ReadCSV(bytes.NewReader(b), "fuzz", Options{})
	})
}

func FuzzReadTensorBoard(f *testing.F) {
	f.Add(bytes.Join([][]byte{tfrecord(fileVersion()), tfrecord(event(1, 1, "loss", 1, true)), tfrecord(sessionStart(2))}, nil))
	f.Fuzz(func(t *testing.T, b []byte) {
		ReadTensorBoard(bytes.NewReader(b), "fuzz", Options{})
		// Valid framing around arbitrary Event bytes reaches the decoder.
		ReadTensorBoard(bytes.NewReader(tfrecord(b)), "fuzz", Options{})
	})
}

// TestHugeLineStreamed feeds 32 MiB without a newline: the reader skips it
// with a bounded buffer and still reads the lines after it.
func TestHugeLineStreamed(t *testing.T) {
	t.Parallel()
	r := io.MultiReader(
		strings.NewReader(`{"step":1,"loss":2}`+"\n"),
		io.LimitReader(repeat('x'), 32<<20),
		strings.NewReader("\n"+`{"step":2,"loss":1}`+"\n"),
	)
	s, err := ReadJSONL(r, "huge", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Points) != 2 || s.Problems.Count != 1 || s.Problems.First[0] != (Problem{"line 2", "line longer than 1 MiB"}) {
		t.Errorf("points %v problems %+v", s.Points, s.Problems)
	}
}

// TestNestedValuesIgnored: only the top-level "values" object is read;
// one nested in it is skipped like any other nested value.
func TestNestedValuesIgnored(t *testing.T) {
	t.Parallel()
	_, err := ReadJSONL(strings.NewReader(`{"step":1,"values":{"values":{"loss":1}}}`+"\n"), "nested", Options{})
	var ee *EmptyError
	if !errors.As(err, &ee) {
		t.Errorf("error %v, want no loss values found", err)
	}
}

// BenchmarkNestedValues reads a line of 8000 nested "values" objects and
// one of the same length nested under another key. The nested "values"
// once took time quadratic in the line's length; TestNestedValuesIgnored
// checks the behaviour, this the speed, without a timing assertion in a
// test.
func BenchmarkNestedValues(b *testing.B) {
	const depth = 8000
	for _, key := range []string{"values", "others"} {
		line := `{"step":1,` + strings.Repeat(`"`+key+`":{`, depth) + `"loss":1` + strings.Repeat("}", depth) + "}\n"
		b.Run(key, func(b *testing.B) {
			b.SetBytes(int64(len(line)))
			for b.Loop() {
				ReadJSONL(strings.NewReader(line), "x", Options{})
			}
		})
	}
}

type repeat byte

func (c repeat) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = byte(c)
	}
	return len(p), nil
}
