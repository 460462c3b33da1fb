// Package termsafe makes text that came from a job or a submitter (log
// lines, run names, reasons, labels) safe to print on a terminal: control
// characters are shown escaped instead of being obeyed. It is the one
// place that rule lives; JSON output does not need it (encoders escape).
package termsafe

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// String returns s with every character a terminal could act on written
// as an escape: C0 controls and DEL as \xNN (\t, \n, \r as such), ESC and
// so every CSI and OSC sequence (OSC 8 hyperlinks included) with it, C1
// controls (U+0080–U+009F), bidi embeddings, overrides and isolates
// (U+202A–U+202E, U+2066–U+2069), the other invisible direction marks,
// line and paragraph separators as \uNNNN, and invalid UTF-8 bytes as
// \xNN. Everything else, backslashes included, is copied: the result is
// for reading, not for parsing back.
func String(s string) string {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if unsafe(r, size) {
			break
		}
		i += size
	}
	if i == len(s) {
		return s // the common case: nothing to escape, no copy
	}
	var b strings.Builder
	b.Grow(len(s) + 16)
	b.WriteString(s[:i])
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case !unsafe(r, size):
			b.WriteString(s[i : i+size])
		case r == utf8.RuneError:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\t':
			b.WriteString(`\t`)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r < 0x80:
			fmt.Fprintf(&b, `\x%02x`, r)
		default:
			fmt.Fprintf(&b, `\u%04x`, r)
		}
		i += size
	}
	return b.String()
}

func unsafe(r rune, size int) bool {
	switch {
	case r == utf8.RuneError && size <= 1:
		return true
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	case r == 0x200e, r == 0x200f, r == 0x061c, r == 0x2028, r == 0x2029:
		return true
	}
	return false
}

// ShellQuote quotes s for a POSIX shell when it holds anything but plain
// path characters, so that a command printed for the user to paste runs
// as printed.
func ShellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./+,:@%") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
