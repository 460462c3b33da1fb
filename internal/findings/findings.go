// Package findings renders spec validation results for people and for CI
// systems: grouped text (colour only on a terminal), JSON, GitHub
// workflow annotations, GitLab code-quality JSON and SARIF 2.1.0. It
// writes only to the writers it is given.
package findings

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/url"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpupass/gpupass/internal/ci/ghactions"

	"github.com/gpupass/gpupass/internal/spec"
)

// Options tune the renderers.
type Options struct {
	// Color enables ANSI colour in text output; set it only for a terminal.
	Color bool
	// Version is gpupass's version, recorded in SARIF.
	Version string
	// Getenv reads the environment (GitHub output files); nil: none.
	Getenv func(string) string
}

const (
	ansiReset  = "\x1b[0m"
	ansiBold   = "\x1b[1m"
	ansiRed    = "\x1b[31m"
	ansiYellow = "\x1b[33m"
	ansiCyan   = "\x1b[36m"
	ansiGreen  = "\x1b[32m"
	ansiDim    = "\x1b[2m"
)

// section is the group a finding is shown under: the top-level key of its
// path, or "file" for findings about the file as a whole.
func section(f spec.Finding) string {
	if f.Path == "" {
		return "file"
	}
	top := f.Path
	if i := strings.IndexAny(top, ".["); i >= 0 {
		top = top[:i]
	}
	switch top {
	case "runtime", "security", "resources":
		return top
	}
	return "spec" // name, description, and keys that are not in the schema
}

func plural(n int, word string) string {
	if n == 1 {
		return fmt.Sprintf("%d %s", n, word)
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// Text writes findings grouped by section, in file order, with a summary
// line per file and the fingerprint of a valid spec.
func Text(w io.Writer, results []*spec.Result, color bool) error {
	paint := func(code, s string) string {
		if !color {
			return s
		}
		return code + s + ansiReset
	}
	var b strings.Builder
	for i, r := range results {
		if i > 0 {
			b.WriteByte('\n')
		}
		status := paint(ansiGreen+ansiBold, "valid")
		if !r.Valid {
			status = paint(ansiRed+ansiBold, "invalid")
		}
		infos := len(r.Findings) - r.Errors - r.Warnings
		fmt.Fprintf(&b, "%s: %s (%s, %s, %s)\n", r.File, status,
			plural(r.Errors, "error"), plural(r.Warnings, "warning"), plural(infos, "note"))
		var order []string
		groups := map[string][]spec.Finding{}
		for _, f := range r.Findings {
			s := section(f)
			if _, ok := groups[s]; !ok {
				order = append(order, s)
			}
			groups[s] = append(groups[s], f)
		}
		for _, s := range order {
			fmt.Fprintf(&b, "\n%s\n", paint(ansiBold, s))
			for _, f := range groups[s] {
				sev := string(f.Severity)
				switch f.Severity {
				case spec.SevError:
					sev = paint(ansiRed, sev)
				case spec.SevWarning:
					sev = paint(ansiYellow, sev)
				default:
					sev = paint(ansiCyan, sev)
				}
				fmt.Fprintf(&b, "  %s:%d:%d: %s [%s] %s\n", f.File, f.Line, f.Column, sev, f.Rule, f.Message)
				if f.Fix != "" {
					fmt.Fprintf(&b, "      %s %s\n", paint(ansiDim, "fix:"), f.Fix)
				}
			}
		}
		if r.Fingerprint != "" {
			fmt.Fprintf(&b, "\nfingerprint: %s\n", r.Fingerprint)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// JSON writes one result object, or an array when there are several.
func JSON(w io.Writer, results []*spec.Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	if len(results) == 1 {
		return enc.Encode(results[0])
	}
	return enc.Encode(results)
}

// GitHub writes workflow commands that GitHub turns into annotations on
// the spec's lines (escaped by ghactions), and sets the step output
// `fingerprint` when GITHUB_OUTPUT is set.
func GitHub(w io.Writer, results []*spec.Result, getenv func(string) string) error {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	for _, r := range results {
		for _, f := range r.Findings {
			props := map[string]string{
				"file":  workspacePath(f.File, getenv("GITHUB_WORKSPACE")),
				"line":  fmt.Sprint(f.Line),
				"col":   fmt.Sprint(f.Column),
				"title": "gpupass " + f.Rule,
			}
			msg := f.Message
			if f.Fix != "" {
				msg += " (fix: " + f.Fix + ")"
			}
			level := "notice"
			switch f.Severity {
			case spec.SevError:
				level = "error"
			case spec.SevWarning:
				level = "warning"
			}
			if err := ghactions.Command(w, level, props, msg); err != nil {
				return fmt.Errorf("writing GitHub annotations: %w", err)
			}
		}
		if path := getenv("GITHUB_OUTPUT"); r.Fingerprint != "" && len(results) == 1 && path != "" {
			if err := ghactions.SetOutput(path, "fingerprint", r.Fingerprint); err != nil {
				return fmt.Errorf("writing output fingerprint to GITHUB_OUTPUT: %w", err)
			}
		}
	}
	return nil
}

// workspacePath makes file relative to the workflow's checkout: GitHub
// attaches an annotation to a line only when the path is repo-relative.
func workspacePath(file, workspace string) string {
	if workspace == "" {
		return file
	}
	abs, err := filepath.Abs(file)
	if err != nil {
		return file
	}
	rel, err := filepath.Rel(workspace, abs)
	if err != nil || strings.HasPrefix(rel, "..") {
		return file
	}
	return filepath.ToSlash(rel)
}

// sarifURI turns a path into a SARIF artifact URI: relative paths stay
// relative (resolved against the checkout), absolute ones become file URIs.
func sarifURI(file string) string {
	if filepath.IsAbs(file) {
		return (&url.URL{Scheme: "file", Path: filepath.ToSlash(file)}).String()
	}
	return filepath.ToSlash(file)
}

// gitlabIssue is one entry of a GitLab code-quality report (the Code
// Climate subset GitLab reads).
type gitlabIssue struct {
	Description string         `json:"description"`
	CheckName   string         `json:"check_name"`
	Fingerprint string         `json:"fingerprint"`
	Severity    string         `json:"severity"`
	Location    gitlabLocation `json:"location"`
}

type gitlabLocation struct {
	Path  string `json:"path"`
	Lines struct {
		Begin int `json:"begin"`
	} `json:"lines"`
}

var gitlabSeverity = map[spec.Severity]string{spec.SevError: "major", spec.SevWarning: "minor", spec.SevInfo: "info"}

// GitLab writes a code-quality report (artifacts:reports:codequality).
func GitLab(w io.Writer, results []*spec.Result) error {
	issues := []gitlabIssue{}
	for _, r := range results {
		for _, f := range r.Findings {
			desc := f.Message
			if f.Fix != "" {
				desc += " (fix: " + f.Fix + ")"
			}
			// The fingerprint identifies the issue across pipelines, so it
			// must not depend on the line: edits above would move it.
			sum := sha256.Sum256([]byte(f.File + "\x00" + f.Rule + "\x00" + f.Path + "\x00" + f.Message))
			is := gitlabIssue{
				Description: desc, CheckName: f.Rule, Fingerprint: hex.EncodeToString(sum[:16]),
				Severity: gitlabSeverity[f.Severity],
			}
			is.Location.Path = f.File
			is.Location.Lines.Begin = f.Line
			issues = append(issues, is)
		}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(issues)
}

// SARIF 2.1.0 subset: one run, the rule catalogue, one result per finding.
type sarifLog struct {
	Schema  string     `json:"$schema"`
	Version string     `json:"version"`
	Runs    []sarifRun `json:"runs"`
}

type sarifRun struct {
	Tool    sarifTool     `json:"tool"`
	Results []sarifResult `json:"results"`
}

type sarifTool struct {
	Driver sarifDriver `json:"driver"`
}

type sarifDriver struct {
	Name    string      `json:"name"`
	Version string      `json:"version,omitempty"`
	Rules   []sarifRule `json:"rules"`
}

type sarifText struct {
	Text string `json:"text"`
}

type sarifRule struct {
	ID                   string    `json:"id"`
	ShortDescription     sarifText `json:"shortDescription"`
	DefaultConfiguration struct {
		Level string `json:"level"`
	} `json:"defaultConfiguration"`
}

type sarifResult struct {
	RuleID    string          `json:"ruleId"`
	RuleIndex int             `json:"ruleIndex"`
	Level     string          `json:"level"`
	Message   sarifText       `json:"message"`
	Locations []sarifLocation `json:"locations"`
}

type sarifLocation struct {
	PhysicalLocation struct {
		ArtifactLocation struct {
			URI string `json:"uri"`
		} `json:"artifactLocation"`
		Region struct {
			StartLine   int `json:"startLine"`
			StartColumn int `json:"startColumn"`
		} `json:"region"`
	} `json:"physicalLocation"`
}

var sarifLevel = map[spec.Severity]string{spec.SevError: "error", spec.SevWarning: "warning", spec.SevInfo: "note"}

// SARIF writes a SARIF 2.1.0 log (GitHub code scanning, GitLab, IDEs).
func SARIF(w io.Writer, results []*spec.Result, version string) error {
	drv := sarifDriver{Name: "gpupass", Version: version}
	index := map[string]int{}
	for i, r := range spec.Rules {
		sr := sarifRule{ID: r.ID, ShortDescription: sarifText{r.Summary}}
		sr.DefaultConfiguration.Level = sarifLevel[r.Severity]
		drv.Rules = append(drv.Rules, sr)
		index[r.ID] = i
	}
	run := sarifRun{Tool: sarifTool{Driver: drv}, Results: []sarifResult{}}
	for _, r := range results {
		for _, f := range r.Findings {
			i, ok := index[f.Rule]
			if !ok {
				return fmt.Errorf("finding with rule %q missing from spec.Rules", f.Rule)
			}
			msg := f.Message
			if f.Fix != "" {
				msg += " Fix: " + f.Fix
			}
			var loc sarifLocation
			loc.PhysicalLocation.ArtifactLocation.URI = sarifURI(f.File)
			loc.PhysicalLocation.Region.StartLine = f.Line
			loc.PhysicalLocation.Region.StartColumn = f.Column
			run.Results = append(run.Results, sarifResult{
				RuleID: f.Rule, RuleIndex: i, Level: sarifLevel[f.Severity],
				Message: sarifText{msg}, Locations: []sarifLocation{loc},
			})
		}
	}
	log := sarifLog{
		Schema:  "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json",
		Version: "2.1.0",
		Runs:    []sarifRun{run},
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(log)
}

// RuleIDs returns the ids of spec.Rules, sorted (for tests and docs).
func RuleIDs() []string {
	ids := make([]string, len(spec.Rules))
	for i, r := range spec.Rules {
		ids[i] = r.ID
	}
	slices.Sort(ids)
	return ids
}
