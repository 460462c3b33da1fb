package spec

import (
	"strings"
	"testing"
	"time"
)

func TestParseTimeLimit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string // substring of the error; empty: valid
	}{
		{in: "90m", want: 90 * time.Minute},
		{in: " 2h30m ", want: 150 * time.Minute},
		{in: "2s", want: 2 * time.Second},
		{in: "720h", want: MaxTimeLimit},
		{in: "3600", err: "needs a unit"},
		{in: "two hours", err: "not a duration"},
		{in: "0s", err: "not positive"},
		{in: "-5m", err: "not positive"},
		{in: "1500ms", err: "whole seconds"},
		{in: "721h", err: "longer than 720h"},
	} {
		got, err := ParseTimeLimit(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("ParseTimeLimit(%q): %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseTimeLimit(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
		case tc.err == "" && got != tc.want:
			t.Errorf("ParseTimeLimit(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

func TestFormatTimeLimit(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		MaxTimeLimit: "720h", 90 * time.Minute: "1h30m", 30 * time.Second: "30s", 2 * time.Hour: "2h", 61 * time.Second: "1m1s",
	} {
		if got := FormatTimeLimit(d); got != want {
			t.Errorf("FormatTimeLimit(%v) = %q, want %q", d, got, want)
		}
	}
}

// TestTimeLimitFinding: a bad resources.time-limit is one positioned
// finding naming the field and the fix.
func TestTimeLimitFinding(t *testing.T) {
	t.Parallel()
	res := Validate("gpupass.yaml", []byte("name: x\nruntime: {cuda: 12.1.105, nvidia-driver: 535.104.05, python: 3.10.12, pytorch: 2.1.2+cu121}\nresources:\n  accelerator: h100-sxm5\n  time-limit: 45d\n"))
	if res.Valid || len(res.Findings) != 1 {
		t.Fatalf("want one finding, got valid=%v %+v", res.Valid, res.Findings)
	}
	f := res.Findings[0]
	if f.Rule != "resources.time-limit" || f.Path != "resources.time-limit" || f.Line != 5 || !strings.Contains(f.Fix, "time-limit: 2h") {
		t.Errorf("finding = %+v", f)
	}
}

// TestParseQueueTimeout: the queue timeout takes what a time limit takes,
// up to its own bound (7 days), and refuses nonsense with the fix.
func TestParseQueueTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "10m", want: 10 * time.Minute},
		{in: "3s", want: 3 * time.Second},
		{in: "168h", want: MaxQueueTimeout},
		{in: "169h", err: "longer than 168h, the most a queue timeout may be"},
		{in: "-10m", err: "not positive; a queue timeout must be at least 1s"},
		{in: "0s", err: "not positive"},
		{in: "600", err: "needs a unit"},
		{in: "1.5s", err: "whole seconds"},
	} {
		got, err := ParseQueueTimeout(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("ParseQueueTimeout(%q): %v", tc.in, err)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("ParseQueueTimeout(%q) = %v, %v; want an error with %q", tc.in, got, err, tc.err)
		case tc.err == "" && got != tc.want:
			t.Errorf("ParseQueueTimeout(%q) = %v, want %v", tc.in, got, tc.want)
		}
	}
}

// TestQueueTimeoutFinding: a bad resources.queue-timeout is one
// positioned finding with a fix; a good one parses from the spec.
func TestQueueTimeoutFinding(t *testing.T) {
	t.Parallel()
	const head = "name: x\nruntime: {cuda: 12.1.105, nvidia-driver: 535.104.05, python: 3.10.12, pytorch: 2.1.2+cu121}\nresources:\n  accelerator: h100-sxm5\n"
	res := Validate("gpupass.yaml", []byte(head+"  queue-timeout: -5m\n"))
	if len(res.Findings) != 1 {
		t.Fatalf("findings = %+v, want one", res.Findings)
	}
	f := res.Findings[0]
	if f.Rule != "resources.queue-timeout" || f.Path != "resources.queue-timeout" || f.Line != 5 || !strings.Contains(f.Fix, "queue-timeout: 30m") {
		t.Errorf("finding = %+v", f)
	}
	res = Validate("gpupass.yaml", []byte(head+"  queue-timeout: 10m\n"))
	if len(res.Findings) != 0 {
		t.Fatalf("findings of a good queue-timeout = %+v, want none", res.Findings)
	}
	if d, err := res.Spec.Resources.QueueTimeoutDuration(); err != nil || d != 10*time.Minute {
		t.Errorf("QueueTimeoutDuration = %v, %v; want 10m", d, err)
	}
}
