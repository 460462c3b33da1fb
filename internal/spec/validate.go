package spec

import (
	"encoding/json"
	"fmt"
)

// MaxFindings is the most findings Validate reports for one file.
const MaxFindings = 500

// Result is the outcome of validating one spec file.
type Result struct {
	File     string    `json:"file"`
	Valid    bool      `json:"valid"`
	Errors   int       `json:"errors"`
	Warnings int       `json:"warnings"`
	Findings []Finding `json:"findings"`
	// Fingerprint and Canonical are set only for a valid spec: the
	// fingerprint of a spec with errors would name an environment that
	// cannot exist.
	Fingerprint string          `json:"fingerprint,omitempty"`
	Canonical   json.RawMessage `json:"canonical,omitempty"`
	// Spec is the parsed spec (nil when the file could not be read as one).
	Spec *Spec `json:"-"`
}

// Validate parses data (the content of file) and runs every rule. It
// never panics and never fails: every problem is a finding.
func Validate(file string, data []byte) *Result {
	res := &Result{File: file}
	doc, fs := Parse(file, data)
	if doc != nil {
		fs = append(fs, Check(doc)...)
		res.Spec = &doc.Spec
	}
	sortFindings(fs)
	if len(fs) > MaxFindings {
		// Hostile or generated input can produce a finding per line; past
		// this many, more would only flood the terminal and the CI log.
		n := len(fs) - MaxFindings
		fs = append(fs[:MaxFindings], Finding{
			Rule: "spec.truncated", Severity: SevError, File: file, Line: fs[MaxFindings].Line, Column: fs[MaxFindings].Column,
			Message: fmt.Sprintf("%d more findings not shown", n), Fix: "fix the findings above and validate again",
		})
	}
	if fs == nil {
		fs = []Finding{}
	}
	res.Findings = fs
	res.Errors, res.Warnings = Counts(fs)
	res.Valid = doc != nil && res.Errors == 0
	if res.Valid {
		if c, err := Canonical(res.Spec); err == nil {
			res.Canonical = c
			res.Fingerprint, _ = Fingerprint(res.Spec)
		}
	}
	return res
}
