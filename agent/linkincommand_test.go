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
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type rank struct {
		cmd  *exec.Cmd
		out  strings.Builder
		link conformance.Link
		why  error
		done chan error
	}
	start := func(n int) *rank {
		r := &rank{done: make(chan error, 1), link: conformance.Link{Ranks: 2}}
		base := filepath.Join(dir, fmt.Sprintf("attempt-1-r%d", n))
		step := &executor.LinkStep{Python: py, Script: allreduceScript,
			Args: []string{strconv.Itoa(linkBytes), strconv.Itoa(linkIterations), "60"},
			Measured: func(out []byte, why error) (string, error) {
				if r.why = why; why == nil {
					r.why = readLinkResult(&r.link, string(out))
				}
				return "", nil
			}}
		argv, ok := step.InCommand(base, []string{py, "train.py"})
		if !ok {
			t.Fatal("a python script was not taken")
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
	for n, r := range []*rank{r0, r1} {
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
