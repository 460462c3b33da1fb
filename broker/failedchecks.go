package broker

import (
	"strconv"
	"unicode/utf8"

	"github.com/gpupass/gpupass/internal/conformance"
)

// Bounds on what the registry keeps of a report's failed checks: the
// report is signed by the node but its messages are free text (a Slurm
// admin's drain reason), shown in every nodes listing and dry-run.
const (
	maxFailedChecks     = 4
	maxFailedCheckBytes = 300
)

// failedChecks are the report's failed checks as "name: message" (the
// actual value when there is no message), the first maxFailedChecks,
// each cut to maxFailedCheckBytes.
func failedChecks(r *conformance.Report) []string {
	var out []string
	for _, c := range r.Checks {
		if c.Status != conformance.Fail {
			continue
		}
		if len(out) == maxFailedChecks {
			out = append(out, "…and more failed checks")
			break
		}
		why := c.Message
		if why == "" {
			why = "expected " + c.Expected + ", measured " + c.Actual
		}
		out = append(out, clipBytes(c.Name+": "+why, maxFailedCheckBytes))
	}
	return out
}

// clipBytes shortens s to at most n bytes on a rune boundary, marking the cut.
func clipBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n-len("…")]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}

// gresGPUs is the GRES GPU count a Slurm node's report states; nil when
// it states none (not a Slurm node, or an agent before the check).
func gresGPUs(r *conformance.Report) *int {
	for _, c := range r.Checks {
		if c.Name != conformance.CheckSlurmGres {
			continue
		}
		if n, err := strconv.Atoi(c.Expected); err == nil && n >= 0 {
			return &n
		}
	}
	return nil
}
