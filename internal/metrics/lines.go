package metrics

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// maxLine bounds one line of a text input; longer lines are reported and
// skipped so a binary or corrupt file cannot make a reader buffer it whole.
const maxLine = 1 << 20

// lines streams the lines of r without keeping more than one in memory.
type lines struct {
	br   *bufio.Reader
	n    int
	long bool // the last line was over maxLine and was skipped
}

func newLines(r io.Reader) *lines {
	return &lines{br: bufio.NewReaderSize(r, maxLine)}
}

// next returns the next line without its line ending. The slice is valid
// until the following call. It returns io.EOF after the last line.
func (l *lines) next() ([]byte, error) {
	l.long = false
	line, err := l.br.ReadSlice('\n')
	if errors.Is(err, bufio.ErrBufferFull) {
		l.long = true
		for errors.Is(err, bufio.ErrBufferFull) {
			_, err = l.br.ReadSlice('\n')
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
