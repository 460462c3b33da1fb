//go:build e2e

package slurm_test

import (
	"archive/zip"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil/slurmtest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestE2ESlurmUp: `gpupass up --executor slurm` brings up a broker and
// an agent standing for the test cluster's nodes, and the pipeline runs
// through Slurm: dry-run flags n2, whose measured GPUs (the a100-80gb-4x
// profile: 4) disagree with its GRES (gpu:h100:2), and refuses a spec
// needing more GPUs than n1's GRES; train runs as a batch job, and runs
// (text and JSON), compare and the audit zip name its cluster, job id,
// node and partition; an admin's drain takes n1 out of dry-run with
// Slurm's reason.
func TestE2ESlurmUp(t *testing.T) {
	c := slurmtest.Shared(t)
	py := upstack.RequireTorch(t)
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"hpc-up"},
		Args: []string{"--executor", "slurm", "--slurm-partition", slurmtest.Partition, "--slurm-shared-dir", c.Shared},
		Env:  []string{"SLURM_CONF=" + c.Conf, "GPUPASS_SLURM_REFRESH=2s"}})
	gp := func(args ...string) (string, error) {
		cmd := stack.Command(ctx, args...)
		cmd.Env = append(cmd.Env, "COSIGN_PASSWORD=e2e-slurm")
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(args ...string) string {
		t.Helper()
		out, err := gp(args...)
		if err != nil {
			t.Fatalf("gpupass %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	dryRun := func(spec string) string {
		out, _ := gp("validate", "--spec", spec, "--dry-run", "--region", "hpc-up")
		return out
	}
	var out string
	defer func() {
		if t.Failed() {
			t.Logf("last output:\n%s", out)
		}
	}()

	// n2 is flagged; a spec needing 6 GPUs is refused on n1's GRES.
	upstack.WaitFor(t, ctx, "n2 flagged for its GRES in dry-run", func() bool {
		out = dryRun("examples/train/gpupass.yaml")
		return strings.Contains(out, "failed check slurm.gres: measured 4 GPU(s) on n2, but its slurm GRES (gpu:h100:2) gives jobs 2") &&
			regexp.MustCompile(`slurm:gptest +hpc-up +a100-80gb x4`).MatchString(out)
	})
	spec, err := os.ReadFile(filepath.Join(stack.Root, "examples/train/gpupass.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	six := filepath.Join(t.TempDir(), "six.yaml")
	if err := os.WriteFile(six, []byte(strings.Replace(string(spec), "count: 1", "count: 6", 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	out = dryRun(six)
	if !strings.Contains(out, "resources.count: expected at least 6 GPUs, the slurm node's GRES gives a job 4") {
		t.Errorf("dry-run of a 6-GPU spec does not refuse n1 on its GRES")
	}

	// train through sbatch; the run names its job everywhere.
	out = must("--output", "json", "train", "--spec", "examples/train/gpupass.yaml", "--region", "hpc-up",
		"--workdir", "examples/train", "--name", "slurm-up", "--follow", "--", py, "train.py", "--steps", "5")
	id := regexp.MustCompile(`alloc-[A-Za-z0-9_-]+`).FindString(out)
	out = must("--output", "json", "runs")
	var runs struct {
		Runs []struct {
			ID    string `json:"id"`
			State string `json:"state"`
			Slurm *struct {
				Cluster   string `json:"cluster"`
				JobID     string `json:"job_id"`
				Node      string `json:"node"`
				Partition string `json:"partition"`
			} `json:"slurm"`
		} `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &runs); err != nil || len(runs.Runs) != 1 {
		t.Fatalf("runs -o json: %v", err)
	}
	r := runs.Runs[0]
	if r.ID != id || r.State != "succeeded" || r.Slurm == nil || r.Slurm.Cluster != "gptest" || r.Slurm.Node != "n1" ||
		r.Slurm.Partition != slurmtest.Partition || !regexp.MustCompile(`^[0-9]+$`).MatchString(r.Slurm.JobID) {
		t.Fatalf("run %+v slurm %+v: want %s succeeded on gptest/n1/%s with a job id", r, r.Slurm, id, slurmtest.Partition)
	}
	where := "slurm job " + r.Slurm.JobID + " on n1 (cluster gptest, partition gpu)"
	if jobs := c.Command(t, "squeue", "-h", "-t", "all", "-j", r.Slurm.JobID, "-o", "%j"); strings.TrimSpace(jobs) != "gpupass-"+id {
		t.Errorf("slurm job %s is %q, want gpupass-%s", r.Slurm.JobID, jobs, id)
	}
	if out = must("runs"); !strings.Contains(out, where) {
		t.Errorf("gpupass runs does not name %q", where)
	}
	if out = must("compare", id, "--post", "none"); !strings.Contains(out, where) {
		t.Errorf("compare's run line does not name %q", where)
	}
	dir := t.TempDir()
	must("audit", "keygen", "--out-prefix", filepath.Join(dir, "cosign"))
	zipPath := filepath.Join(dir, "audit.zip")
	must("audit", id, "--key", filepath.Join(dir, "cosign.key"), "--out", zipPath)
	if sum := readZip(t, zipPath, "run-summary.json"); !strings.Contains(sum, `"job_id": "`+r.Slurm.JobID+`"`) || !strings.Contains(sum, `"cluster": "gptest"`) {
		t.Errorf("the audit's run-summary.json does not name the slurm job:\n%s", sum)
	}

	// An admin drains n1: dry-run excludes it with Slurm's reason.
	c.Command(t, "scontrol", "update", "nodename=n1", "state=drain", "reason=fan")
	defer c.Command(t, "scontrol", "update", "nodename=n1", "state=resume")
	wctx, wcancel := context.WithTimeout(ctx, 60*time.Second)
	defer wcancel()
	upstack.WaitFor(t, wctx, "n1's drain reason in dry-run", func() bool {
		out = dryRun("examples/train/gpupass.yaml")
		return strings.Contains(out, "0 candidate(s)") && strings.Contains(out, "failed check slurm.node: slurm node n1 is drain: fan")
	})
	if out = must("nodes"); !strings.Contains(out, "slurm node n1 is drain: fan") {
		t.Errorf("gpupass nodes does not show the drain reason")
	}
	// Each agent's HOST is the Slurm node it stands for (issue #32 item 7),
	// in the table and in JSON.
	for _, n := range []string{"n1", "n2"} {
		if !regexp.MustCompile(`(?m)^agt-[0-9a-f]+ +` + n + ` +slurm:gptest +hpc-up `).MatchString(out) {
			t.Errorf("gpupass nodes shows no agent with HOST %s", n)
		}
	}
	out = must("--output", "json", "nodes")
	var nodes struct {
		Nodes []struct {
			ID       string `json:"id"`
			Hostname string `json:"hostname"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal([]byte(out), &nodes); err != nil {
		t.Fatalf("nodes -o json: %v", err)
	}
	hosts := map[string]bool{}
	for _, n := range nodes.Nodes {
		hosts[n.Hostname] = true
	}
	if len(nodes.Nodes) != 2 || !hosts["n1"] || !hosts["n2"] {
		t.Errorf("nodes -o json: hostnames %v, want n1 and n2", hosts)
	}
}

// TestE2ESlurmUpAgentFlags: every flag of the agent's Slurm executor is
// one of gpupass up's, taken from the executor (gpupass links none) and
// handed to the stack's agent: --slurm-simulate gives n2 a profile of its
// own, which nodes shows; gpupass up had no such flag before (issue #33).
func TestE2ESlurmUpAgentFlags(t *testing.T) {
	c := slurmtest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	stack := upstack.Start(t, upstack.Options{Regions: []string{"hpc-flags"},
		Args: []string{"--executor", "slurm", "--slurm-partition", slurmtest.Partition, "--slurm-shared-dir", c.Shared,
			"--slurm-simulate", "n2=rtx-4090-1x", "--slurm-refresh", "2s"},
		Env: []string{"SLURM_CONF=" + c.Conf}})
	var out string
	upstack.WaitFor(t, ctx, "n1 on up's --profile and n2 on its --slurm-simulate profile in gpupass nodes", func() bool {
		b, _ := stack.Command(ctx, "nodes").CombinedOutput()
		out = string(b)
		return regexp.MustCompile(`(?m)^agt-[0-9a-f]+ +n1 +slurm:gptest +hpc-flags .*a100-80gb x4`).MatchString(out) &&
			regexp.MustCompile(`(?m)^agt-[0-9a-f]+ +n2 +slurm:gptest +hpc-flags .*rtx-4090.* x1`).MatchString(out)
	})
	if t.Failed() {
		t.Logf("gpupass nodes:\n%s", out)
	}
}

func readZip(t *testing.T, path, name string) string {
	t.Helper()
	z, err := zip.OpenReader(path)
	if err != nil {
		t.Fatal(err)
	}
	defer z.Close()
	f, err := z.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
