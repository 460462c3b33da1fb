package spool

import "os"

// WithWrite injects the file write, to simulate a full disk.
func WithWrite(o Options, w func(f *os.File, b []byte) (int, error)) Options {
	o.write = w
	return o
}
