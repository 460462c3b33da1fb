// Package ci speaks the CI systems' own step protocols for the gpupass
// commands: step outputs, job summaries, masks, log groups and error
// annotations on GitHub Actions (GITHUB_ACTIONS=true), and dotenv hand-off
// files and collapsible sections on GitLab CI (GITLAB_CI=true). Outside CI
// every call is a no-op, so commands can call it unconditionally.
//
// It never prints a secret: Mask takes the value only to tell the runner
// to hide it. It does no network I/O.
package ci

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/gpupass/gpupass/internal/ci/ghactions"
	"github.com/gpupass/gpupass/internal/fsutil"
)

// Kind is the CI system a step runs in.
type Kind string

const (
	None   Kind = ""
	GitHub Kind = "github"
	GitLab Kind = "gitlab"
)

// DotenvVar names the variable that overrides where GitLab values go; the
// templates declare the same file under artifacts:reports:dotenv.
const (
	DotenvVar     = "GPUPASS_DOTENV"
	DefaultDotenv = "gpupass.env"
)

// Env is the CI environment of one process. Log is where workflow commands
// and section markers go: stderr, so stdout stays machine-readable
// (`--output json`); both runners read commands from either stream.
type Env struct {
	kind   Kind
	getenv func(string) string
	log    io.Writer
	mu     sync.Mutex
	masked map[string]bool
}

// Detect returns the CI environment described by getenv.
func Detect(getenv func(string) string, log io.Writer) *Env {
	kind := None
	if getenv != nil {
		switch {
		case getenv("GITHUB_ACTIONS") == "true":
			kind = GitHub
		case getenv("GITLAB_CI") == "true":
			kind = GitLab
		}
	}
	return New(kind, getenv, log)
}

// New returns the environment of a CI system the caller names (a
// command's -o github or -o gitlab) rather than detects. Files the
// runner did not name (GITHUB_OUTPUT, GITHUB_STEP_SUMMARY) are still
// skipped.
func New(kind Kind, getenv func(string) string, log io.Writer) *Env {
	if getenv == nil {
		getenv = func(string) string { return "" }
	}
	if log == nil {
		log = io.Discard
	}
	return &Env{kind: kind, getenv: getenv, log: log, masked: map[string]bool{}}
}

// Kind reports the CI system.
func (e *Env) Kind() Kind { return e.kind }

// Mask tells GitHub to hide value in the job log. Each line is masked on
// its own, as the runner matches line by line. GitLab cannot mask at run
// time; there the caller's only duty is not to print the value.
func (e *Env) Mask(value string) {
	if e.kind != GitHub || strings.TrimSpace(value) == "" {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, line := range strings.Split(strings.ReplaceAll(value, "\r\n", "\n"), "\n") {
		if strings.TrimSpace(line) == "" || e.masked[line] {
			continue
		}
		e.masked[line] = true
		// The command escapes the data, which the runner unescapes:
		// written raw, a secret holding "%0A" or "%25" would be masked as
		// another string, and leak.
		_ = ghactions.Command(e.log, "add-mask", nil, line)
	}
}

// The patterns are compiled on first use, not at every gpupass start.
var outputName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z][a-z0-9-]*$`) })

// SetOutput hands a value to later steps or jobs: the step output name on
// GitHub (GITHUB_OUTPUT), and GPUPASS_<NAME> in the dotenv file on GitLab,
// which the job declares under artifacts:reports:dotenv. Unset files are
// skipped: a workflow run locally has none.
func (e *Env) SetOutput(name, value string) error {
	if !outputName().MatchString(name) {
		return fmt.Errorf("output name %q: want lowercase kebab-case", name)
	}
	switch e.kind {
	case GitHub:
		path := e.getenv("GITHUB_OUTPUT")
		if path == "" {
			return nil
		}
		if err := ghactions.SetOutput(path, name, value); err != nil {
			return fmt.Errorf("writing output %s to GITHUB_OUTPUT: %w", name, err)
		}
		return nil
	case GitLab:
		if strings.ContainsAny(value, "\r\n") {
			return fmt.Errorf("output %s: GitLab dotenv values are one line", name)
		}
		path := e.getenv(DotenvVar)
		if path == "" {
			path = DefaultDotenv
		}
		return setDotenv(path, "GPUPASS_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_")), value)
	}
	return nil
}

// setDotenv writes KEY=value, replacing an earlier value of KEY, so a
// retried step leaves one line per key. The file is replaced whole, never
// rewritten in place: a step killed mid-write must not lose the earlier
// outputs (allocation ids) that later jobs read from it.
func setDotenv(path, key, value string) error {
	var lines []string
	perm := os.FileMode(0o644)
	if fi, err := os.Stat(path); err == nil {
		perm = fi.Mode().Perm()
	}
	if b, err := os.ReadFile(path); err == nil {
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		for sc.Scan() {
			if k, _, _ := strings.Cut(sc.Text(), "="); k != key && sc.Text() != "" {
				lines = append(lines, sc.Text())
			}
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading dotenv %s: %w", path, err)
	}
	lines = append(lines, key+"="+value)
	if err := fsutil.WriteFileAtomic(path, []byte(strings.Join(lines, "\n")+"\n"), perm); err != nil {
		return fmt.Errorf("dotenv: %w", err)
	}
	return nil
}

// Summary appends markdown to the GitHub job summary when the runner gives
// one (GITHUB_STEP_SUMMARY); elsewhere it does nothing.
func (e *Env) Summary(md string) error {
	path := e.getenv("GITHUB_STEP_SUMMARY")
	if e.kind != GitHub || path == "" {
		return nil
	}
	if err := ghactions.AppendFile(path, md+"\n"); err != nil {
		return fmt.Errorf("writing GITHUB_STEP_SUMMARY: %w", err)
	}
	return nil
}

// Group opens a collapsible log group and returns the function that closes
// it: ::group:: on GitHub, a section_start/section_end pair on GitLab.
func (e *Env) Group(title string) (end func()) {
	switch e.kind {
	case GitHub:
		fmt.Fprintf(e.log, "::group::%s\n", oneLine(title))
		return func() { fmt.Fprintln(e.log, "::endgroup::") }
	case GitLab:
		name := sectionName(title)
		fmt.Fprintf(e.log, "\x1b[0Ksection_start:%d:%s[collapsed=true]\r\x1b[0K%s\n", time.Now().Unix(), name, oneLine(title))
		return func() { fmt.Fprintf(e.log, "\x1b[0Ksection_end:%d:%s\r\x1b[0K\n", time.Now().Unix(), name) }
	}
	return func() {}
}

// Error reports a failed step as one error annotation on GitHub (and as a
// plain line elsewhere). It returns whether it wrote an annotation, so the
// caller does not print the same message twice.
func (e *Env) Error(title, msg string) bool {
	if e.kind != GitHub {
		return false
	}
	_ = ghactions.Command(e.log, "error", map[string]string{"title": title}, msg)
	return true
}

var nonSection = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`[^a-z0-9_.-]+`) })

func sectionName(title string) string {
	s := strings.Trim(nonSection().ReplaceAllString(strings.ToLower(title), "_"), "_")
	if s == "" {
		s = "gpupass"
	}
	return s
}

func oneLine(s string) string { return strings.NewReplacer("\r", " ", "\n", " ").Replace(s) }
