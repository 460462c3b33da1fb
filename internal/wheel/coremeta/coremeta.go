// Package coremeta reads the header block of Python's core metadata files
// (METADATA, PKG-INFO, WHEEL). It is apart from package wheel so that the
// node probe, which reads installed distributions' METADATA, links no zip
// reader or compressor (their package initialisation costs every gpupass
// start).
package coremeta

import (
	"bufio"
	"bytes"
	"strings"
)

// Headers reads the RFC 822 style header block of b: the first value of
// each field, up to the first blank line (the description follows it).
// Continuation lines are skipped.
func Headers(b []byte) map[string]string {
	out := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		if line == "" {
			break
		}
		if line[0] == ' ' || line[0] == '\t' {
			continue
		}
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		k = strings.TrimSpace(k)
		if _, seen := out[k]; !seen {
			out[k] = strings.TrimSpace(v)
		}
	}
	return out
}

// NameVersion returns the Name and Version fields of a METADATA or
// PKG-INFO file.
func NameVersion(b []byte) (name, version string) {
	h := Headers(b)
	return h["Name"], h["Version"]
}
