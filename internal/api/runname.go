package api

import (
	"fmt"
	"unicode"
	"unicode/utf8"
)

// MaxRunNameBytes bounds a run's name (the broker appends the region).
const MaxRunNameBytes = 128

// RunNameRule is what CheckRunName allows, for error messages.
const RunNameRule = "letters, digits, '.', '_' and '-', starting with a letter or digit, at most 128 bytes"

// CheckRunName refuses a run name that is not plain text: names are shown
// in `gpupass runs`, logs and the dashboard, and one with control,
// formatting or bidi characters could rewrite what a terminal shows.
// Letters of any script are allowed (with their combining marks), spaces
// are not (tables split on them).
func CheckRunName(name string) error {
	if name == "" || len(name) > MaxRunNameBytes || !utf8.ValidString(name) {
		return fmt.Errorf("run name %q: use %s", name, RunNameRule)
	}
	for i, r := range name {
		ok := unicode.IsLetter(r) || unicode.IsDigit(r) || (i > 0 && (unicode.Is(unicode.M, r) || r == '.' || r == '_' || r == '-'))
		if !ok {
			return fmt.Errorf("run name %q: character %U is not allowed; use %s", name, r, RunNameRule)
		}
	}
	return nil
}
