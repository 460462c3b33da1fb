package bundle

import (
	"bytes"
	"errors"
	"testing"
)

// callWriter records the size of every Write and fails the failAt-th.
type callWriter struct {
	bytes.Buffer
	calls  []int
	failAt int
}

func (w *callWriter) Write(p []byte) (int, error) {
	w.calls = append(w.calls, len(p))
	if len(w.calls) == w.failAt {
		return 0, errors.New("disk full")
	}
	return w.Buffer.Write(p)
}

// A pulled blob reaches the kernel in writes of at most writePiece bytes
// (why: see writePiece), all of it, in order.
func TestWritePiecesSplitsLargeWrites(t *testing.T) {
	t.Parallel()
	for _, size := range []int{0, 1, writePiece, writePiece + 1, receiveBuffer, receiveBuffer - 7} {
		b := make([]byte, size)
		for i := range b {
			b[i] = byte(i * 31)
		}
		var w callWriter
		if err := writePieces(&w, b); err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(w.Bytes(), b) {
			t.Fatalf("size %d: written bytes differ from the input", size)
		}
		for i, n := range w.calls {
			if n > writePiece || n == 0 {
				t.Fatalf("size %d: write %d was %d bytes, want 1..%d", size, i, n, writePiece)
			}
		}
		if want := (size + writePiece - 1) / writePiece; len(w.calls) != want {
			t.Fatalf("size %d: %d writes, want %d", size, len(w.calls), want)
		}
	}
	w := callWriter{failAt: 2}
	if err := writePieces(&w, make([]byte, receiveBuffer)); err == nil || len(w.calls) != 2 {
		t.Fatalf("a failed write: err %v after %d calls, want the error after 2", err, len(w.calls))
	}
}
