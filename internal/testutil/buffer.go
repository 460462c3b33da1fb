package testutil

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer safe to read while a process or goroutines
// write it (a broker's log, a command's output).
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
