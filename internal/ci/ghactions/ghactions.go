// Package ghactions writes GitHub Actions workflow commands
// (::error file=…::message, ::add-mask::…) and environment files
// (GITHUB_OUTPUT, GITHUB_STEP_SUMMARY), as the runner reads them
// (https://docs.github.com/actions/reference/workflow-commands-for-github-actions).
//
// It replaces go-githubactions on gpupass's start-up path: that module
// links go-envconfig, which links encoding/gob for one interface type,
// and gob's package initialisation alone costs every gpupass process
// about 0.7 ms. It does no network I/O and never logs a value.
package ghactions

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
)

// Command writes the workflow command `::name props::message` on one
// line, escaped as the runner unescapes it, properties sorted by key.
func Command(w io.Writer, name string, props map[string]string, message string) error {
	var b strings.Builder
	b.WriteString("::")
	b.WriteString(name)
	for i, k := range slices.Sorted(maps.Keys(props)) {
		if i == 0 {
			b.WriteByte(' ')
		} else {
			b.WriteByte(',')
		}
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(escapeProperty(props[k]))
	}
	b.WriteString("::")
	b.WriteString(escapeData(message))
	b.WriteByte('\n')
	_, err := io.WriteString(w, b.String())
	return err
}

// escapeData: a message is one line, so the runner reads %0A as a line
// break; an unescaped "%0A" in the data would be read as one too.
func escapeData(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A").Replace(s)
}

// escapeProperty: properties are also separated by "," and ended by "::".
func escapeProperty(s string) string {
	return strings.NewReplacer("%", "%25", "\r", "%0D", "\n", "%0A", ":", "%3A", ",", "%2C").Replace(s)
}

// SetOutput appends name=value to the step outputs file (GITHUB_OUTPUT)
// at path, as a heredoc whose delimiter is random, so no value can end it
// early and set other outputs.
func SetOutput(path, name, value string) error {
	var r [16]byte
	if _, err := rand.Read(r[:]); err != nil {
		return err
	}
	delim := "ghadelimiter_" + hex.EncodeToString(r[:])
	if strings.Contains(name, delim) || strings.Contains(value, delim) {
		return errors.New("output value holds the random delimiter") // 2^-128
	}
	return AppendFile(path, fmt.Sprintf("%s<<%s\n%s\n%s\n", name, delim, value, delim))
}

// AppendFile appends data to an environment file the runner gave
// (GITHUB_STEP_SUMMARY, GITHUB_OUTPUT), creating it when missing.
func AppendFile(path, data string) error {
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	_, err = f.WriteString(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
