// Package slurm reaches compute nodes through a Slurm cluster's own
// command-line tools, from a login node and without root (root only to
// submit each run's jobs as a uid of its own, sbatch --uid): it discovers a
// partition's nodes (sinfo/scontrol), runs a job step on one node (srun)
// and runs a run's attempts as batch jobs pinned to a node (sbatch),
// following their output files in a directory every node sees, mapping
// Slurm's job states to an attempt's end and stopping them with scancel.
//
// The command-line tools, not slurmrestd: they are on every login node
// with the user's own munge credentials, where slurmrestd needs an admin
// to deploy it and hand out JWT keys.
//
// It never starts a process on a compute node other than through Slurm,
// and never imports the broker.
package slurm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Client runs the Slurm command-line tools.
type Client struct {
	// Env is added to the environment of every tool (SLURM_CONF in
	// tests; empty on a login node, where the tools find their config).
	Env []string
	// Timeout bounds one tool call (default 30s): slurmctld may be slow,
	// never silent forever.
	Timeout time.Duration
}

// ToolError is a Slurm tool that failed: its name, arguments, status and
// what it printed on stderr.
type ToolError struct {
	Tool   string
	Args   []string
	Err    error
	Stderr string
}

func (e *ToolError) Error() string {
	msg := strings.TrimSpace(e.Stderr)
	if len(msg) > 500 {
		msg = msg[:500] + "…"
	}
	return fmt.Sprintf("%s %s: %v: %s", e.Tool, strings.Join(e.Args, " "), e.Err, msg)
}

func (e *ToolError) Unwrap() error { return e.Err }

// run runs one tool with extra environment env (nil: the client's own)
// and returns its stdout.
func (c *Client) run(ctx context.Context, env []string, name string, args ...string) (string, error) {
	return c.runStdin(ctx, env, "", name, args...)
}

// toolGrace is how long a tool past its timeout has, after SIGTERM,
// before it is killed.
const toolGrace = 10 * time.Second

// runStdin is run with stdin as the tool's standard input.
func (c *Client) runStdin(ctx context.Context, env []string, stdin, name string, args ...string) (string, error) {
	d := c.Timeout
	if d <= 0 {
		d = 30 * time.Second
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	// Past its time a tool gets SIGTERM and a moment to act on it before
	// SIGKILL: an srun killed outright while its step launches leaves its
	// allocation held (for good where InactiveLimit is 0, Slurm's
	// default), keeping the node from every later job; on SIGTERM srun
	// ends the step and gives the allocation back.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = toolGrace
	if env == nil {
		env = os.Environ()
	}
	cmd.Env = append(env[:len(env):len(env)], c.Env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if stdin != "" {
		cmd.Stdin = strings.NewReader(stdin)
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil && !errors.Is(err, context.Canceled) {
			err = fmt.Errorf("%w (after %s)", err, d)
		}
		return out.String(), &ToolError{Tool: name, Args: args, Err: err, Stderr: errb.String()}
	}
	return out.String(), nil
}

// ClusterName is the cluster's ClusterName (scontrol show config).
func (c *Client) ClusterName(ctx context.Context) (string, error) {
	out, err := c.run(ctx, nil, "scontrol", "show", "config")
	if err != nil {
		return "", fmt.Errorf("reading the cluster name: %w", err)
	}
	for _, l := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(l, "=")
		if ok && strings.TrimSpace(k) == "ClusterName" {
			if v = strings.TrimSpace(v); v != "" {
				return v, nil
			}
		}
	}
	return "", errors.New("reading the cluster name: scontrol show config has no ClusterName")
}

// Step runs command as a job step on node (srun -w NODE -N1 -n1) with
// the GRES gres ("gpu:a100:4"; empty: none) and the job comment comment
// (Ledger.Hold's; empty: none) and returns its stdout. The step's stderr
// is in the error when it fails.
func (c *Client) Step(ctx context.Context, node, gres, comment string, env []string, command ...string) (string, error) {
	args := []string{"-w", node, "-N1", "-n1", "--quiet", "--job-name", "gpupass-check"}
	if comment != "" {
		args = append(args, "--comment", comment)
	}
	if gres != "" {
		args = append(args, "--gres="+gres)
	}
	args = append(args, "--export=ALL")
	args = append(args, command...)
	out, err := c.run(ctx, env, "srun", args...)
	if err != nil {
		return out, fmt.Errorf("job step on %s: %w", node, err)
	}
	return out, nil
}

// fields parses Slurm's one-line "Key=Value Key=Value" records
// (scontrol show … -o). A value may hold spaces (OS=Linux 6.1 #1 SMP,
// Reason=Kill task failed [root@…]): it runs to the next " Key=".
func fields(line string) map[string]string {
	m := map[string]string{}
	line = strings.TrimSpace(line)
	var starts []int
	for i := 0; i < len(line); i++ {
		if i > 0 && line[i-1] != ' ' {
			continue
		}
		j := i
		for j < len(line) && (isKeyByte(line[j])) {
			j++
		}
		if j > i && j < len(line) && line[j] == '=' && line[i] >= 'A' && line[i] <= 'Z' {
			starts = append(starts, i)
		}
	}
	for n, s := range starts {
		end := len(line)
		if n+1 < len(starts) {
			end = starts[n+1]
		}
		k, v, _ := strings.Cut(line[s:end], "=")
		m[k] = strings.TrimSpace(v)
	}
	return m
}

func isKeyByte(b byte) bool {
	return b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9' || b == '_' || b == '/' || b == ':' || b == '.'
}
