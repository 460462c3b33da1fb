package agent

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/testutil"
)

// TestLinkInCommandTorch (issue #34): a gang of two ranks whose command
// is a Python script measures the link in the command's own Python with
// torch's gloo: each rank's result is the gang's figure, recorded as
// measured in the command, and the command's own rendezvous at
// MASTER_PORT, started as soon as its import of torch returns, is its
// own, not the measurement's. A variable the script sets before its
// import of torch still reaches torch. A stranger at MASTER_PORT while
// rank 0 waits for the others is answered nothing.
func TestLinkInCommandTorch(t *testing.T) {
	t.Parallel()
	py := defaultLinkPython
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		testutil.Missing(t, "%s with torch (python3-torch)", py)
	}
	dir := t.TempDir()
	const train = `import os, sys
os.environ["OMP_NUM_THREADS"] = "1"
import torch
import torch.distributed as dist
print("threads", torch.get_num_threads(), flush=True)
dist.init_process_group("gloo", init_method="env://")
t = torch.full((4,), float(dist.get_rank() + 1))
dist.all_reduce(t)
print("sum", t.tolist(), "world", dist.get_world_size(), flush=True)
`
	if err := os.WriteFile(filepath.Join(dir, "train.py"), []byte(train), 0o644); err != nil {
		t.Fatal(err)
	}
	port := testutil.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	start := func(n int) *inCommandRank { return startInCommandRank(t, ctx, dir, port, n, []string{py, "train.py"}) }
	r0 := start(0)
	// Rank 0 waits for the others at MASTER_PORT once its torch is
	// imported; a stranger there (another gang's rank, any client) is
	// not told where the measurement meets.
	var told string
	for end := time.Now().Add(2 * time.Minute); ; time.Sleep(20 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), time.Second)
		if err == nil {
			_ = c.SetDeadline(time.Now().Add(5 * time.Second))
			fmt.Fprintf(c, "gpupass-link another-gang 1\n")
			told, _ = bufio.NewReader(c).ReadString('\n')
			c.Close()
			break
		}
		if time.Now().After(end) {
			t.Fatalf("rank 0 never listened at MASTER_PORT %d: %s", port, r0.out.String())
		}
	}
	if told != "" {
		t.Errorf("rank 0 told a stranger %q", told)
	}
	r1 := start(1)
	for n, r := range []*inCommandRank{r0, r1} {
		if err := <-r.done; err != nil {
			t.Errorf("rank %d's command: %v\n%s", n, err, r.out.String())
		}
		out := r.out.String()
		if !strings.Contains(out, "threads 1") || !strings.Contains(out, "sum [3.0, 3.0, 3.0, 3.0] world 2") {
			t.Errorf("rank %d's command printed %q; want its own variable seen by torch and its own rendezvous", n, out)
		}
		if r.why != nil || r.link.BusBWGbps <= 0 || !r.link.InCommand || r.link.Torch == "" || r.link.Backend != "gloo" {
			t.Errorf("rank %d's link: %+v, %v; want measured by gloo in the command", n, r.link, r.why)
		}
	}
	if r0.link.BusBWGbps != r1.link.BusBWGbps {
		t.Errorf("the ranks' figures differ: %g and %g; want the gang's (the slowest rank's)", r0.link.BusBWGbps, r1.link.BusBWGbps)
	}
}

// inCommandRank is one rank of a gang of two run by startInCommandRank.
type inCommandRank struct {
	cmd  *exec.Cmd
	out  strings.Builder
	link conformance.Link
	why  error
	done chan error
}

// startInCommandRank starts rank n of a gang of two on this machine
// (rank 0 at 127.0.0.1:port) running command in dir, the link measured in
// the command's own Python (LinkStep.InCommand), as a cluster rank's job
// would; done hears the command's end once the link's result, or why
// there is none, was read into link and why.
func startInCommandRank(t *testing.T, ctx context.Context, dir string, port, n int, command []string) *inCommandRank {
	t.Helper()
	r := &inCommandRank{done: make(chan error, 1), link: conformance.Link{Ranks: 2}}
	base := filepath.Join(dir, fmt.Sprintf("attempt-1-r%d", n))
	step := &executor.LinkStep{Python: defaultLinkPython, Script: allreduceScript,
		Args: []string{strconv.Itoa(linkBytes), strconv.Itoa(linkIterations), "60"},
		Measured: func(out []byte, why error) (string, error) {
			if r.why = why; why == nil {
				r.why = readLinkResult(&r.link, string(out))
			}
			return "", nil
		}}
	argv, ok := step.InCommand(base, command)
	if !ok {
		t.Fatalf("%q was not taken", command)
	}
	r.cmd = exec.CommandContext(ctx, argv[0], argv[1:]...)
	r.cmd.Dir = dir
	r.cmd.Env = append(os.Environ(), "MASTER_ADDR=127.0.0.1", "MASTER_PORT="+strconv.Itoa(port), "WORLD_SIZE=2", "NNODES=2",
		"RANK="+strconv.Itoa(n), "NODE_RANK="+strconv.Itoa(n), "LOCAL_RANK=0", executor.EnvGangRun+"=alloc-test")
	r.cmd.Stdout, r.cmd.Stderr = &r.out, &r.out
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := r.cmd.Wait()
		_ = executor.NewLinkWatch(step, base, nil).Finish("exited")
		r.done <- err
	}()
	return r
}

// TestLinkInCommandTorchrun: a node that starts its ranks with torchrun
// (python3 -m torch.distributed.run) measures once, in torchrun's own
// Python, and torchrun's rendezvous at MASTER_PORT and its worker's
// training go on as without gpupass.
func TestLinkInCommandTorchrun(t *testing.T) {
	t.Parallel()
	if err := exec.Command(defaultLinkPython, "-c", "import torch").Run(); err != nil {
		testutil.Missing(t, "%s with torch (python3-torch)", defaultLinkPython)
	}
	root := testutil.RepoRoot(t)
	port := testutil.FreePort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var ranks []*inCommandRank
	for n := range 2 {
		// Debian's torchrun 1.13 needs --redirects 1 --tee 1 on Python 3.11.
		ranks = append(ranks, startInCommandRank(t, ctx, t.TempDir(), port, n, []string{defaultLinkPython, "-m", "torch.distributed.run",
			"--redirects", "1", "--tee", "1", "--nnodes", "2", "--nproc_per_node", "1", "--node_rank", strconv.Itoa(n),
			"--master_addr", "127.0.0.1", "--master_port", strconv.Itoa(port), filepath.Join(root, "examples", "ddp", "train_ddp.py"), "--steps", "3"}))
	}
	for n, r := range ranks {
		if err := <-r.done; err != nil {
			t.Errorf("rank %d's torchrun: %v\n%s", n, err, r.out.String())
		}
		if want := fmt.Sprintf("ddp: rank %d/2", n); !strings.Contains(r.out.String(), want) {
			t.Errorf("rank %d's torchrun printed no %q:\n%s", n, want, r.out.String())
		}
		if r.why != nil || r.link.BusBWGbps <= 0 || !r.link.InCommand {
			t.Errorf("rank %d's link: %+v, %v; want measured in torchrun's Python", n, r.link, r.why)
		}
	}
}
