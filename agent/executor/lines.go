package executor

import (
	"bytes"
	"io"
	"unicode/utf8"

	"github.com/gpupass/gpupass/internal/events"
)

// DefaultMaxLine bounds an output line: a process printing a 100 MB line
// (or binary data with no newline) costs this much memory, not 100 MB.
const DefaultMaxLine = 16 << 10

// readLines splits r into lines of at most maxLine bytes and calls emit
// for each. Memory stays bounded by the read buffer plus maxLine whatever
// the input: the part of a longer line past maxLine is counted and dropped
// as it is read.
func readLines(r io.Reader, stream events.Stream, maxLine int, emit func(Line)) error {
	if maxLine <= 0 {
		maxLine = DefaultMaxLine
	}
	buf := make([]byte, 64<<10)
	cur := make([]byte, 0, min(maxLine, 4096))
	cut := 0
	flush := func() {
		emit(makeLine(stream, cur, cut))
		cur, cut = cur[:0], 0
	}
	for {
		n, err := r.Read(buf)
		chunk := buf[:n]
		for len(chunk) > 0 {
			i := bytes.IndexByte(chunk, '\n')
			part := chunk
			if i >= 0 {
				part = chunk[:i]
			}
			if room := maxLine - len(cur); len(part) > room {
				cur = append(cur, part[:room]...)
				cut += len(part) - room
			} else {
				cur = append(cur, part...)
			}
			if i < 0 {
				break
			}
			flush()
			chunk = chunk[i+1:]
		}
		if err != nil {
			if len(cur) > 0 || cut > 0 {
				flush()
			}
			if err == io.EOF {
				return nil
			}
			return err
		}
	}
}

func makeLine(stream events.Stream, b []byte, cut int) Line {
	b = bytes.TrimSuffix(b, []byte("\r"))
	if cut > 0 {
		// Do not let the cut itself split a character and look like bad
		// input: back off to the start of the last whole rune.
		for k := 1; k < utf8.UTFMax && k <= len(b); k++ {
			c := b[len(b)-k]
			if utf8.RuneStart(c) {
				if c >= utf8.RuneSelf && !utf8.FullRune(b[len(b)-k:]) {
					cut += k
					b = b[:len(b)-k]
				}
				break
			}
		}
	}
	l := Line{Stream: stream, Cut: cut}
	if utf8.Valid(b) {
		l.Text = string(b)
	} else {
		l.Text = string(bytes.ToValidUTF8(b, []byte("\uFFFD")))
		l.InvalidUTF8 = true
	}
	return l
}
