package bundle

import (
	"io"
	"sync"
)

// chunkSize is how much of a blob is received before it is written to
// disk and handed to the wheel verifier: the network gives a few tens of
// KiB per read, and a write syscall or a goroutine wake-up per read cost
// more CPU than the copy they would save.
const chunkSize = 1 << 20

// chunkBuffers is how many chunks of one blob are in flight: one being
// received, the others queued for or read by the verifier, so that the
// download and the second hash overlap instead of taking turns (an
// io.Pipe returns to the writer only when the reader took everything).
const chunkBuffers = 3

type chunk struct {
	b   []byte
	err error // set on the last chunk: io.EOF or why the blob stopped
}

// chunkPipe hands filled buffers from the receiving goroutine to a reader
// without copying them again and recycles them once read.
type chunkPipe struct {
	full chan chunk
	free chan []byte
	cur  []byte
	buf  []byte // cur's buffer, returned to free when cur is used up
	err  error
}

// chunkPool keeps buffers between wheels: a fresh 1 MiB buffer costs
// page faults and zeroing on every pull of every wheel.
var chunkPool = sync.Pool{New: func() any { b := make([]byte, chunkSize); return &b }}

func newChunkPipe() *chunkPipe {
	p := &chunkPipe{full: make(chan chunk, chunkBuffers), free: make(chan []byte, chunkBuffers)}
	for range chunkBuffers {
		p.free <- *chunkPool.Get().(*[]byte)
	}
	return p
}

// release returns the buffers to the pool; call it only when neither
// side of the pipe uses it any more. A buffer not back in free (a reader
// that stopped early) is left to the garbage collector.
func (p *chunkPipe) release() {
	for {
		select {
		case b := <-p.free:
			b = b[:cap(b)]
			chunkPool.Put(&b)
		default:
			return
		}
	}
}

// fill reads r into a free buffer until the buffer is full or r ends; it
// returns the bytes and r's error (io.EOF at the end).
func (p *chunkPipe) fill(r io.Reader) ([]byte, error) {
	// Not io.ReadFull: it turns a short final chunk into
	// io.ErrUnexpectedEOF, which is also what a dropped connection gives.
	b := <-p.free
	n := 0
	for n < len(b) {
		k, err := r.Read(b[n:])
		n += k
		if err != nil {
			return b[:n], err
		}
	}
	return b[:n], nil
}

// send queues b (from fill) for the reader; err, when not nil, ends the
// stream after b. The reader must read until it sees that error, which
// VerifyStream does.
func (p *chunkPipe) send(b []byte, err error) { p.full <- chunk{b, err} }

func (p *chunkPipe) Read(b []byte) (int, error) {
	c, err := p.Next(len(b))
	return copy(b, c), err
}

// Next lends up to n bytes of the current chunk (wheel.Nexter); they stay
// valid until the next Read or Next, which may recycle their buffer.
func (p *chunkPipe) Next(n int) ([]byte, error) {
	for len(p.cur) == 0 {
		if p.buf != nil {
			p.free <- p.buf[:cap(p.buf)]
			p.buf = nil
		}
		if p.err != nil {
			return nil, p.err
		}
		c := <-p.full
		p.cur, p.buf, p.err = c.b, c.b, c.err
	}
	k := min(n, len(p.cur))
	b := p.cur[:k]
	p.cur = p.cur[k:]
	return b, nil
}
