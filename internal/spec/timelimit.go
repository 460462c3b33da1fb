package spec

import (
	"fmt"
	"strings"
	"time"
)

// MaxTimeLimit caps resources.time-limit. A limit is there to end runs
// that hang; one past a month is a typo (720h meant as 72h), not a plan.
// The broker may cap lower (gpupass-broker serve --max-time-limit).
const MaxTimeLimit = 30 * 24 * time.Hour

// ParseTimeLimit parses a run's wall-clock limit as written in
// resources.time-limit or gpupass train --time-limit: a Go duration with
// a unit ("90m", "2h30m"), in whole seconds, positive, at most
// MaxTimeLimit. The one rule for both, so a limit the CLI takes is one
// the spec takes.
func ParseTimeLimit(s string) (time.Duration, error) {
	return parseBounded(s, "a time limit", MaxTimeLimit)
}

// parseBounded is the rule of ParseTimeLimit and ParseQueueTimeout: a Go
// duration with a unit, whole seconds, positive, at most most.
func parseBounded(s, what string, most time.Duration) (time.Duration, error) {
	s = strings.TrimSpace(s)
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a duration such as 90m or 2h30m (a number needs a unit: s, m, h)", clip(s))
	}
	switch {
	case d <= 0:
		return 0, fmt.Errorf("%q is not positive; %s must be at least 1s", s, what)
	case d%time.Second != 0:
		return 0, fmt.Errorf("%q is not whole seconds; write e.g. 90s", s)
	case d > most:
		return 0, fmt.Errorf("%q is longer than %s, the most %s may be", s, FormatTimeLimit(most), what)
	}
	return d, nil
}

// TimeLimitDuration returns resources.time-limit (0: the spec sets none).
func (r Resources) TimeLimitDuration() (time.Duration, error) {
	if r.TimeLimit == "" {
		return 0, nil
	}
	d, err := ParseTimeLimit(r.TimeLimit)
	if err != nil {
		return 0, fmt.Errorf("resources.time-limit: %w", err)
	}
	return d, nil
}

// FormatTimeLimit writes a limit the way a user would ("720h", "1h30m",
// not "720h0m0s").
func FormatTimeLimit(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func (c *checker) timeLimit() {
	const path = "resources.time-limit"
	r := &c.d.Spec.Resources
	if !c.d.Has(path) || r.TimeLimit == "" {
		return
	}
	if _, err := ParseTimeLimit(r.TimeLimit); err != nil {
		c.add("resources.time-limit", SevError, path, "time limit: "+err.Error(),
			"write a duration up to "+FormatTimeLimit(MaxTimeLimit)+", e.g. `time-limit: 2h` (or leave it out for no limit)")
	}
}

// MaxQueueTimeout caps resources.queue-timeout and train --queue-timeout.
// A run waiting a week for a busy node is waiting on nodes that are not
// coming back; a longer bound is a typo, not a plan.
const MaxQueueTimeout = 7 * 24 * time.Hour

// ParseQueueTimeout parses how long a run may wait in its region's queue
// for a busy node, as written in resources.queue-timeout or gpupass train
// --queue-timeout: a Go duration with a unit ("10m", "2h"), whole
// seconds, positive, at most MaxQueueTimeout.
func ParseQueueTimeout(s string) (time.Duration, error) {
	return parseBounded(s, "a queue timeout", MaxQueueTimeout)
}

// QueueTimeoutDuration returns resources.queue-timeout (0: the spec sets
// none).
func (r Resources) QueueTimeoutDuration() (time.Duration, error) {
	if r.QueueTimeout == "" {
		return 0, nil
	}
	d, err := ParseQueueTimeout(r.QueueTimeout)
	if err != nil {
		return 0, fmt.Errorf("resources.queue-timeout: %w", err)
	}
	return d, nil
}

func (c *checker) queueTimeout() {
	const path = "resources.queue-timeout"
	r := &c.d.Spec.Resources
	if !c.d.Has(path) || r.QueueTimeout == "" {
		return
	}
	if _, err := ParseQueueTimeout(r.QueueTimeout); err != nil {
		c.add("resources.queue-timeout", SevError, path, "queue timeout: "+err.Error(),
			"write a duration up to "+FormatTimeLimit(MaxQueueTimeout)+", e.g. `queue-timeout: 30m` (or leave it out to wait until a node is free)")
	}
}
