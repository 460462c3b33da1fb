package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
)

// maxLine bounds one line of a text input; longer lines are reported and
// skipped so a binary or corrupt file cannot make a reader buffer it whole.
const maxLine = 1 << 20

// lines streams the lines of r without keeping more than one in memory.
type lines struct {
	br    *bufio.Reader
	n     int
	bytes int64 // bytes consumed so far
	long  bool  // the last line was over maxLine and was skipped
}

func newLines(r io.Reader) *lines {
	return &lines{br: bufio.NewReaderSize(r, maxLine)}
}

// next returns the next line without its line ending. The slice is valid
// until the following call. It returns io.EOF after the last line.
func (l *lines) next() ([]byte, error) {
	l.long = false
	line, err := l.br.ReadSlice('\n')
	l.bytes += int64(len(line))
	if errors.Is(err, bufio.ErrBufferFull) {
		l.long = true
		for errors.Is(err, bufio.ErrBufferFull) {
			var rest []byte
			rest, err = l.br.ReadSlice('\n')
			l.bytes += int64(len(rest))
		}
		l.n++
		if err != nil && err != io.EOF {
			return nil, err
		}
		return nil, nil
	}
	if err == io.EOF && len(line) == 0 {
		return nil, io.EOF
	}
	if err != nil && err != io.EOF {
		return nil, err
	}
	l.n++
	line = bytes.TrimRight(line, "\r\n")
	return line, nil
}

// read returns the next line of a text reader's body: a line over
// maxLine is skipped and added to p as a problem, a read error comes back
// naming source, and io.EOF follows the last line.
func (l *lines) read(source string, p *Problems) ([]byte, lineRef, error) {
	for {
		line, err := l.next()
		if err == io.EOF {
			return nil, 0, err
		}
		if err != nil {
			return nil, 0, fmt.Errorf("reading %s: %w", source, err)
		}
		if !l.long {
			return line, lineRef(l.n), nil
		}
		p.Add(lineRef(l.n).String(), "line longer than 1 MiB")
	}
}

// sizeSample is how many points a reader collects before it sizes the
// point slice from the input size, so a million-point file is not copied
// again and again while its slice grows.
const sizeSample = 4096

// maxPresize caps the up-front reservation at 4 Mi points (96 MiB).
const maxPresize = 4 << 20

// presize grows p to hold the points that total input bytes likely hold,
// given that read bytes held len(p).
func presize(p []Point, read, total int64) []Point {
	if read <= 0 || total <= read {
		return p
	}
	est := int(float64(total) / float64(read) * float64(len(p)) * 1.02)
	// The estimate trusts that the rest of the input looks like its start;
	// a file padded with garbage or a hole (2 GB of NULs) would have it
	// reserve gigabytes. Past maxPresize, append's doubling takes over.
	est = min(est, maxPresize)
	if est <= cap(p) {
		return p
	}
	// make, not slices.Grow: a large fresh allocation is not cleared, so
	// no page is touched before adviseHuge.
	np := make([]Point, len(p), est)
	adviseHuge(np)
	copy(np, p)
	return np
}
