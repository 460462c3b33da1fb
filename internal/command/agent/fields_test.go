package agent

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestFlagNames: every flag the table renames a field to is one the
// agent has, so a renamed error never sends the user to a flag that does
// not exist.
func TestFlagNames(t *testing.T) {
	t.Parallel()
	root := NewCommand(nil)
	for field, name := range allFlagNames() {
		flag, _, _ := strings.Cut(strings.TrimPrefix(name, "--"), " ")
		if root.Flags().Lookup(flag) == nil {
			t.Errorf("field %q: renamed to %q, not a flag of gpupass-agent", field, name)
		}
	}
}

// TestOptionErrorsNameFlags: the daemon's options say what is wrong in
// its own terms (agent.Options.Validate), and gpupass-agent names the
// flag the user typed.
func TestOptionErrorsNameFlags(t *testing.T) {
	t.Parallel()
	// --broker-url is a list (repeat it for replicas): a later empty one
	// adds nothing, so the no-URL case leaves it out of the base.
	url := []string{"--broker-url", "http://127.0.0.1:1"}
	base := []string{"--broker-token", "x", "--region", "r"}
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no broker url", nil, "--broker-url is required"},
		{"no region", []string{"--region", " "}, "--region is required, e.g. us-west-2"},
		{"storage class", []string{"--storage-class", "floppy"}, `--storage-class "floppy": use one of standard`},
		{"negative bandwidth", []string{"--bandwidth-gbps", "-1"}, `--bandwidth-gbps "-1": must not be negative`},
		{"suite interval", []string{"--suite-interval", "10ms"}, `--suite-interval "10ms": must be at least 1s`},
		{"log lines", []string{"--run-log-lines-per-second", "-2"}, `--run-log-lines-per-second "-2": must be 1 or more`},
		{"log size", []string{"--run-log-max-mb", "-2"}, `--run-log-max-mb "-2": must be 1 or more`},
		{"keep runs", []string{"--keep-runs", "-1"}, `--keep-runs "-1": must be 0`},
		{"read probe", []string{"--read-probe-mb", "5000"}, `--read-probe-mb "5000": must be between 0 and 4096`},
		{"run as root", []string{"--run-as", "root"}, `--run-as "root" is root`},
		{"run as and range", []string{"--run-as", "nobody", "--run-as-range", "200000-200999"}, `--run-as "nobody" and --run-as-range "200000-200999" exclude each other: give one (the --run-as-range gives`},
		{"uid range", []string{"--run-as-range", "0-10"}, `--run-as-range "0-10": includes uid 0`},
		{"cgroup", []string{"--run-cgroup", "maybe"}, `--run-cgroup "maybe": use auto, required or off`},
		{"pids", []string{"--run-pids-max", "-1"}, `--run-pids-max "-1": must be 0`},
		{"private tmp", []string{"--run-private-tmp", "yes"}, `--run-private-tmp "yes": use auto, required or off`},
		{"shm size", []string{"--run-shm-size", "16gb"}, `--run-shm-size "16gb": not a size: want bytes with an optional k, m, g or t suffix (e.g. 16g), or a percentage of RAM (e.g. 50%)`},
		{"shm size zero", []string{"--run-shm-size", "0"}, `--run-shm-size "0": must be more than 0`},
		{"kill timeout", []string{"--run-kill-timeout", "1ms"}, `--run-kill-timeout "1ms": must be at least 1s`},
		{"registry credentials", []string{"--registry-username", "u"}, "--registry-username and --registry-password go together"},
		{"job ports without an address", []string{"--job-ports", "29500-29599"}, "--job-address is required with job ports"},
		{"job address without ports", []string{"--job-address", "10.0.0.7"}, "--job-ports is required with a job address"},
		{"job ports backwards", []string{"--job-address", "10.0.0.7", "--job-ports", "29599-29500"}, `--job-ports "29599-29500": 29599-29500 ends before it starts: want FIRST-LAST, e.g. 29500-29599`},
		{"job ports not ports", []string{"--job-address", "10.0.0.7", "--job-ports", "ssh"}, `--job-ports "ssh": "ssh": want FIRST-LAST, e.g. 29500-29599`},
		{"job address of kubernetes pods", []string{"--executor", "kubernetes", "--job-address", "10.0.0.7", "--job-ports", "29500-29599"}, `--job-address "10.0.0.7": the kubernetes executor's jobs are reached at rank 0's pod IP: leave it out (--job-ports alone)`},
		{"job address on slurm", []string{"--executor", "slurm", "--job-address", "10.0.0.7", "--job-ports", "29500-29599"}, `--job-address "10.0.0.7" is each compute node's own with the slurm executor (its NodeAddr in scontrol show node): leave it out`},
		{"job address a shell would read more into", []string{"--job-address", "10.0.0.7;id", "--job-ports", "29500"}, `--job-address "10.0.0.7;id": "10.0.0.7;id" is neither an IP address nor a host name`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errw bytes.Buffer
			args := append([]string{}, base...)
			if tt.name != "no broker url" {
				args = append(args, url...)
			}
			// Bounded: options that pass by mistake start the daemon,
			// which would otherwise run until the test binary times out.
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			code := Main(ctx, append(append(args, tt.args...), "--state-dir", t.TempDir()), &out, &errw)
			if code != ExitUsage || !strings.Contains(errw.String(), tt.want) {
				t.Errorf("exit %d stderr %q, want exit %d and %q", code, errw.String(), ExitUsage, tt.want)
			}
		})
	}
}
