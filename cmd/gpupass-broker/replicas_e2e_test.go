//go:build e2e

package main_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// replica is a gpupass-broker process whose log the test reads while it
// runs.
type replica struct {
	url string
	cmd *exec.Cmd
	log *testutil.Buffer
}

func startReplica(t *testing.T, bin, db string, env ...string) *replica {
	t.Helper()
	return startReplicaAt(t, bin, db, freePort(t), env...)
}

// startReplicaAt is startReplica listening on addr (a restart at the
// address agents already use).
func startReplicaAt(t *testing.T, bin, db, addr string, env ...string) *replica {
	t.Helper()
	r := &replica{url: "http://" + addr, log: &testutil.Buffer{}}
	r.cmd = exec.Command(bin, "serve", "--listen", addr)
	r.cmd.Env = append(append(os.Environ(), "GPUPASS_DB="+db), env...)
	r.cmd.Stderr = r.log
	if err := r.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.cmd.Process.Kill()
		_, _ = r.cmd.Process.Wait()
		if t.Failed() {
			t.Logf("--- broker %s (tail)\n%s", r.url, upstack.Tail(r.log.String(), 4000))
		}
	})
	return r
}

// TestReplicasFailover runs two brokers on one PostgreSQL and an agent
// given both URLs. The broker the agent is on, which also holds the lease
// of once-only work, is killed with SIGKILL while a run streams; the run
// completes through the survivor with every line stored exactly once, a
// `gpupass logs --follow` given both URLs prints every line exactly once,
// and the survivor takes the lease: it is the one that reports the node
// offline when the agent dies afterwards.
func TestReplicasFailover(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	brokerBin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	agentBin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	cliBin := testutil.BuildBinary(t, "./cmd/gpupass")
	db := brokertest.NewDB(t, "postgres").URL()
	agentTok, submitTok := tokenCreate(t, brokerBin, db, "agent", "*"), tokenCreate(t, brokerBin, db, "submit", "*")
	env := []string{"GPUPASS_HEARTBEAT_INTERVAL=1s", "GPUPASS_OFFLINE_AFTER=6s", "GPUPASS_LEASE_TTL=3s",
		"GPUPASS_RUN_MAX_RECORDS_PER_SECOND=-1"}
	took := regexp.MustCompile(`took the lease of once-only work`)

	// A first, so that it holds the lease; the agent is on the first URL.
	a := startReplica(t, brokerBin, db, env...)
	upstack.WaitFor(t, ctx, "replica A to take the lease", func() bool { return took.MatchString(a.log.String()) })
	b := startReplica(t, brokerBin, db, env...)
	upstack.WaitFor(t, ctx, "replica B to serve", func() bool { return strings.Contains(b.log.String(), "url=") })
	urls := a.url + "," + b.url

	state := t.TempDir()
	agentLog := &testutil.Buffer{}
	agent := exec.Command(agentBin, "--broker-url", a.url, "--broker-url", b.url, // the flag repeated
		"--region", "ap-south-1", "--provider", "local", "--hostname", "node-1", "--state-dir", state,
		"--simulate", "a100-80gb-4x", "--python", upstack.Python, "--query-addr", "127.0.0.1:0",
		"--read-probe-mb", "1", "--suite-interval", "1m", "--price-per-hour", "2.5", "--storage-class", "standard", "--bandwidth-gbps", "25")
	agent.Env = append(os.Environ(), "GPUPASS_BROKER_TOKEN="+agentTok, "GPUPASS_RUN_LOG_LINES_PER_SECOND=-1")
	agent.Stderr = agentLog
	agent.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = agent.Process.Kill()
		_, _ = agent.Process.Wait()
		if t.Failed() {
			t.Logf("--- agent (tail)\n%s", upstack.Tail(agentLog.String(), 4000))
		}
	})

	// The CLI and the test's own client take the list too.
	rc, err := client.DialRuns(urls, client.Options{Token: submitTok})
	if err != nil {
		t.Fatal(err)
	}
	nc, err := client.Dial(urls, client.Options{Token: submitTok})
	if err != nil {
		t.Fatal(err)
	}
	var nodeID string
	upstack.WaitFor(t, ctx, "the node to certify", func() bool {
		resp, err := nc.Node.ListNodes(ctx, connect.NewRequest(&gpupassv1.ListNodesRequest{}))
		if err != nil || len(resp.Msg.Nodes) != 1 || !resp.Msg.Nodes[0].Online || !resp.Msg.Nodes[0].ConformancePassed {
			return false
		}
		nodeID = resp.Msg.Nodes[0].Id
		return true
	})

	const lines = 3000
	cliEnv := append(os.Environ(), "GPUPASS_BROKER_URL="+urls, "GPUPASS_BROKER_TOKEN="+submitTok)
	job := fmt.Sprintf(`i=1; while [ $i -le %d ]; do echo "line $i"; if [ $((i %% 100)) -eq 0 ]; then sleep 0.2; fi; i=$((i+1)); done`, lines)
	train := exec.CommandContext(ctx, cliBin, "--output", "json", "train", "--spec", "examples/train/gpupass.yaml",
		"--region", "ap-south-1", "--workdir", t.TempDir(), "--name", "failover", "--", "sh", "-c", job)
	train.Env, train.Dir = cliEnv, testutil.RepoRoot(t)
	out, err := train.Output()
	if err != nil {
		t.Fatalf("gpupass train: %v\n%s", err, out)
	}
	var list runview.List
	if err := json.Unmarshal(out, &list); err != nil || len(list.Runs) != 1 {
		t.Fatalf("train --output json printed %q (%v)", out, err)
	}
	id := list.Runs[0].ID
	follow := exec.CommandContext(ctx, cliBin, "logs", id, "--follow")
	follow.Env, follow.Dir = cliEnv, testutil.RepoRoot(t)
	followOut, followErr := &testutil.Buffer{}, &testutil.Buffer{}
	follow.Stdout, follow.Stderr = followOut, followErr
	if err := follow.Start(); err != nil {
		t.Fatal(err)
	}

	getRun := func() *gpupassv1.Run {
		resp, err := rc.Run.GetRun(ctx, connect.NewRequest(&gpupassv1.GetRunRequest{AllocId: id}))
		if err != nil {
			return nil
		}
		return resp.Msg.Run
	}
	upstack.WaitFor(t, ctx, "the run to stream its first lines", func() bool {
		r := getRun()
		return r != nil && r.HeldThrough > 300 && r.State == gpupassv1.AllocState_ALLOC_STATE_RUNNING
	})
	killedAt := getRun().HeldThrough
	killTime := time.Now()
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_, _ = a.cmd.Process.Wait()

	var r *gpupassv1.Run
	upstack.WaitFor(t, ctx, "the run to finish through the survivor", func() bool {
		r = getRun()
		return r != nil && (r.State == gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || r.State == gpupassv1.AllocState_ALLOC_STATE_FAILED || r.State == gpupassv1.AllocState_ALLOC_STATE_CANCELLED)
	})
	if r.State != gpupassv1.AllocState_ALLOC_STATE_SUCCEEDED || r.HeldThrough != r.LastSeq {
		t.Fatalf("run %s (%s), held through %d of %d; want succeeded with every record (A killed at %d)", r.State, r.Reason, r.HeldThrough, r.LastSeq, killedAt)
	}
	if !strings.Contains(agentLog.String(), "moving to the next") {
		t.Error("the agent did not say it moved to the other replica")
	}

	// Stored: seqs 1..LastSeq once each, every line once, in order.
	st, err := rc.Run.GetLogs(ctx, connect.NewRequest(&gpupassv1.GetLogsRequest{AllocId: id}))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	var got []string
	for st.Receive() {
		for _, rec := range st.Msg().Records {
			seqs = append(seqs, rec.Seq)
			var e events.Event
			if err := e.UnmarshalJSON(rec.Data); err != nil {
				t.Fatalf("event %d: %v", rec.Seq, err)
			}
			if strings.HasPrefix(e.Message, "line ") {
				got = append(got, e.Message)
			}
		}
	}
	if err := st.Err(); err != nil {
		t.Fatal(err)
	}
	for i, s := range seqs {
		if s != uint64(i+1) {
			t.Fatalf("stored seqs have a gap or duplicate at %d: seq %d", i+1, s)
		}
	}
	checkLines := func(what string, got []string) {
		t.Helper()
		if len(got) != lines {
			t.Errorf("%s: %d job lines, want %d", what, len(got), lines)
		}
		for i, l := range got {
			if want := fmt.Sprintf("line %d", i+1); l != want {
				t.Fatalf("%s: line %d is %q, want %q (lost or repeated)", what, i+1, l, want)
			}
		}
	}
	checkLines("stored", got)
	t.Logf("kill -9 of A at seq %d; the run finished through B %s later", killedAt, time.Since(killTime).Round(100*time.Millisecond))

	// The follower, cut off from A, resumed on B from its last seq.
	if err := follow.Wait(); err != nil {
		t.Fatalf("gpupass logs --follow: %v\n%s", err, followErr.String())
	}
	var followed []string
	jobLine := regexp.MustCompile(`\bline \d+$`)
	for l := range strings.SplitSeq(followOut.String(), "\n") {
		if m := jobLine.FindString(strings.TrimSpace(l)); m != "" {
			followed = append(followed, m)
		}
	}
	checkLines("gpupass logs --follow", followed)

	// The once-only work moved: B took the lease, and it is B that
	// reports the node offline once its agent is gone.
	upstack.WaitFor(t, ctx, "replica B to take the lease", func() bool { return took.MatchString(b.log.String()) })
	t.Logf("B took the lease %s after the kill (--lease-ttl 3s)", time.Since(killTime).Round(100*time.Millisecond))
	if err := agent.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	upstack.WaitFor(t, ctx, "replica B to report the node offline", func() bool {
		return strings.Contains(b.log.String(), "node offline: missed heartbeats") && strings.Contains(b.log.String(), nodeID)
	})
}
