package events

import (
	"regexp"
	"strings"
	"sync"
)

// Stream says which output stream a line came from.
type Stream uint8

// The streams of a process.
const (
	Stdout Stream = iota
	Stderr
)

func (s Stream) String() string {
	if s == Stderr {
		return StderrComponent
	}
	return StdoutComponent
}

// Classifier maps the output lines of one stream of a training process to
// a level, a component and a message. It keeps a little state (whether a
// Python traceback is being printed), so use one per stream; it is not
// safe for concurrent use.
//
// The rules, first match wins:
//
//  1. Inside a Python traceback ("Traceback (most recent call last):" up
//     to the non-indented exception line that ends it), every line is
//     ERROR. The traceback header itself is ERROR.
//  2. Python logging's default format "LEVEL:logger:message" gives the
//     level and uses the logger name as the component.
//  3. A leading level word ("ERROR", "WARNING:", "INFO ", also in
//     lower case with a colon: "error: …") sets the level; the rest is
//     read on by rule 4.
//  4. A "component: message" prefix, where component is a lower-case
//     identifier of at most 40 characters with dots, dashes or
//     underscores (runtime.init, dataloader, trainer, checkpoint), names
//     the component, as the example training script prints.
//  5. An exception line ("ValueError: …", "torch.cuda.OutOfMemoryError: …")
//     is ERROR; a Python warning ("x.py:12: UserWarning: …") is WARN.
//  6. Otherwise the level is the stream's default: INFO on stdout and
//     WARN on stderr. A program that writes to stderr without saying a
//     level is usually reporting something off (a warning, a library's
//     complaint); progress output that belongs at INFO can say so with a
//     level word or a logging format.
//
// Lines with no component prefix get the stream's name (stdout, stderr).
type Classifier struct {
	Stream      Stream
	inTraceback bool
}

// Class is what the classifier decided for a line.
type Class struct {
	Level     Level
	Component string
	Message   string
}

// Compiled on first use: every gpupass process links this package, and
// most never classify a line (package init is paid at every start).
var (
	pyLogging = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(DEBUG|INFO|WARNING|ERROR|CRITICAL):([^:\s]{1,80}):(.*)$`)
	})
	levelWord = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^\[?(DEBUG|INFO|WARN|WARNING|ERROR|CRITICAL|FATAL)\]?(?::\s*|\s+)(.*)$`)
	})
	lowerLevel = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^(debug|info|warn|warning|error|critical|fatal):\s*(.*)$`)
	})
	exception = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`^[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|Fault)(?::|$)`)
	})
	pyWarning = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^\S+:\d+: [A-Za-z_]\w*Warning: `) })
)

// maxComponent bounds a component taken from a line prefix.
const maxComponent = 40

// Classify decides the level, component and message of one line (without
// its line ending).
func (c *Classifier) Classify(line string) Class {
	def := Info
	if c.Stream == Stderr {
		def = Warn
	}
	out := Class{Level: def, Component: c.Stream.String(), Message: line}
	trimmed := strings.TrimRight(line, " \t\r")

	if c.inTraceback {
		out.Level = Error
		if trimmed == "" || trimmed[0] == ' ' || trimmed[0] == '\t' ||
			strings.HasPrefix(trimmed, "Traceback (most recent call last)") ||
			strings.HasPrefix(trimmed, "During handling of the above exception") ||
			strings.HasPrefix(trimmed, "The above exception was the direct cause") {
			return out
		}
		// The first non-indented line is the exception itself; it ends
		// the traceback.
		c.inTraceback = false
		return out
	}
	if strings.HasPrefix(trimmed, "Traceback (most recent call last)") {
		c.inTraceback = true
		out.Level = Error
		return out
	}
	if startsUpperLevel(trimmed) {
		if m := pyLogging().FindStringSubmatch(trimmed); m != nil {
			lv, _ := ParseLevel(m[1])
			out.Level, out.Component, out.Message = lv, m[2], m[3]
			return out
		}
	}
	rest := trimmed
	levelSet := false
	if mayHaveLevelWord(rest) {
		if m := levelWord().FindStringSubmatch(rest); m != nil {
			out.Level, _ = ParseLevel(m[1])
			rest, levelSet = m[2], true
		} else if m := lowerLevel().FindStringSubmatch(rest); m != nil {
			out.Level, _ = ParseLevel(m[1])
			rest, levelSet = m[2], true
		}
	}
	if comp, msg, ok := componentPrefix(rest); ok {
		out.Component, rest = comp, msg
	}
	out.Message = rest
	if !levelSet {
		switch {
		case mayBeException(rest) && exception().MatchString(rest):
			out.Level = Error
		case strings.Contains(rest, "Warning: ") && pyWarning().MatchString(rest):
			out.Level = Warn
		}
	}
	return out
}

// The checks below are cheap filters in front of the regular
// expressions: the agent classifies every output line, and most lines
// match none of them.

func startsUpperLevel(s string) bool {
	return len(s) > 4 && strings.IndexByte("DIWEC", s[0]) >= 0 && strings.IndexByte(s[:min(len(s), 9)], ':') > 0
}

func mayHaveLevelWord(s string) bool {
	return len(s) > 3 && strings.IndexByte("DIWECFTdiwecf[", s[0]) >= 0
}

func mayBeException(s string) bool {
	return strings.Contains(s, "Error") || strings.Contains(s, "Exception") || strings.Contains(s, "Interrupt") ||
		strings.Contains(s, "Exit") || strings.Contains(s, "Fault")
}

// componentPrefix reads "component: message" where component is a
// lower-case identifier with dots, dashes or underscores between parts.
func componentPrefix(s string) (comp, msg string, ok bool) {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return "", "", false
	}
	prevSep := false
	for i := 1; i < len(s) && i <= maxComponent; i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '_':
			prevSep = false
		case c == '.' || c == '-':
			if prevSep {
				return "", "", false
			}
			prevSep = true
		case c == ':':
			if prevSep || i+1 >= len(s) || s[i+1] != ' ' {
				return "", "", false
			}
			return s[:i], s[i+2:], true
		default:
			return "", "", false
		}
	}
	return "", "", false
}
