//go:build e2e

package agent_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// proc is a started binary whose stderr is collected.
type proc struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	done   chan error
}

func (p *proc) Stderr() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stderr.String()
}

func start(t *testing.T, env []string, bin string, args ...string) *proc {
	t.Helper()
	p := &proc{cmd: exec.Command(bin, args...), done: make(chan error, 1)}
	p.cmd.Env = append(os.Environ(), env...)
	r, w := io.Pipe()
	p.cmd.Stderr = w
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			p.mu.Lock()
			p.stderr.WriteString(sc.Text() + "\n")
			p.mu.Unlock()
		}
	}()
	go func() {
		err := p.cmd.Wait()
		w.Close()
		p.done <- err
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Kill()
	})
	return p
}

// stop sends SIGTERM and waits: a graceful stop exits 0.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-p.done:
		if err != nil {
			t.Errorf("%s exited with %v after SIGTERM\n%s", filepath.Base(p.cmd.Path), err, p.Stderr())
		}
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop within 20 s of SIGTERM", filepath.Base(p.cmd.Path))
	}
}

func waitFor(t *testing.T, what string, f func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		ok, last := f()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s; last: %s", what, last)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func run(t *testing.T, env []string, bin string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", filepath.Base(bin), strings.Join(args, " "), err, stderr.String())
	}
	return out
}

type listedNode struct {
	ID                 string `json:"id"`
	Region             string `json:"region"`
	Accelerator        string `json:"accelerator"`
	Simulated          bool   `json:"simulated"`
	Online             bool   `json:"online"`
	Profile            string `json:"profile"`
	RuntimeFingerprint string `json:"runtime_fingerprint"`
	ConformancePassed  bool   `json:"conformance_passed"`
}

// TestE2EBrokerAndThreeAgents drives the binaries as a user would: a
// broker on SQLite, three agents on simulated profiles in three regions,
// `gpupass nodes` listing them, the agents' local fingerprint endpoint,
// graceful stop and a restart that keeps the node's identity.
func TestE2EBrokerAndThreeAgents(t *testing.T) {
	brokerBin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	agentBin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	cliBin := testutil.BuildBinary(t, "./cmd/gpupass")
	dir := t.TempDir()
	db := "sqlite://" + filepath.Join(dir, "broker.db")
	tokenOf := func(role string) string {
		var tj struct{ Token string }
		if err := json.Unmarshal(run(t, nil, brokerBin, "--db", db, "-o", "json", "token", "create", "--role", role, "--regions", "*"), &tj); err != nil || tj.Token == "" {
			t.Fatalf("token create: %v", err)
		}
		return tj.Token
	}
	agentTok, readTok := tokenOf("agent"), tokenOf("read")
	tokFile := filepath.Join(dir, "agent.token")
	if err := os.WriteFile(tokFile, []byte(agentTok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	broker := start(t, nil, brokerBin, "--db", db, "serve", "--listen", "127.0.0.1:0", "--heartbeat-interval", "1s", "--offline-after", "5s")
	urlRe := regexp.MustCompile(`url=(http://127\.0\.0\.1:\d+)`)
	var url string
	waitFor(t, "the broker to listen", func() (bool, string) {
		m := urlRe.FindStringSubmatch(broker.Stderr())
		if m != nil {
			url = m[1]
		}
		return m != nil, broker.Stderr()
	})

	type agentRun struct {
		profile, region, state, addrFile string
		p                                *proc
	}
	startAgent := func(a *agentRun) {
		// The token travels as GPUPASS_TOKEN_FILE, as a secret should;
		// the rest as flags.
		a.p = start(t, []string{"GPUPASS_TOKEN_FILE=" + tokFile}, agentBin,
			"--broker-url", url, "--state-dir", a.state, "--region", a.region, "--provider", "sim",
			"--price-per-hour", "10", "--simulate", a.profile, "--query-addr", "127.0.0.1:0", "--addr-file", a.addrFile,
			"--read-probe-mb", "1", "--suite-interval", "1m")
	}
	agents := []*agentRun{
		{profile: "h100-sxm5-8x", region: "us-west-2"},
		{profile: "a100-80gb-4x", region: "eu-central-1"},
		{profile: "rtx-4090-1x", region: "ap-northeast-1"},
	}
	for i, a := range agents {
		a.state = filepath.Join(dir, "agent", a.region)
		a.addrFile = filepath.Join(dir, "addr", a.region)
		_ = os.MkdirAll(filepath.Dir(a.addrFile), 0o755)
		startAgent(agents[i])
	}

	readEnv := []string{"GPUPASS_BROKER_TOKEN=" + readTok}
	list := func() map[string]listedNode {
		var out struct{ Nodes []listedNode }
		if err := json.Unmarshal(run(t, readEnv, cliBin, "nodes", "--broker-url", url, "-o", "json"), &out); err != nil {
			t.Fatalf("gpupass nodes -o json: %v", err)
		}
		m := map[string]listedNode{}
		for _, n := range out.Nodes {
			m[n.Region] = n
		}
		return m
	}
	var nodes map[string]listedNode
	waitFor(t, "three certified nodes in `gpupass nodes`", func() (bool, string) {
		nodes = list()
		ready := 0
		for _, n := range nodes {
			if n.Online && n.RuntimeFingerprint != "" {
				ready++
			}
		}
		return ready == 3, strings.Join(func() []string {
			var s []string
			for _, a := range agents {
				s = append(s, a.p.Stderr())
			}
			return s
		}(), "\n")
	})
	for _, a := range agents {
		n := nodes[a.region]
		if !n.Simulated || n.Profile != a.profile || !n.ConformancePassed {
			t.Errorf("%s: %+v", a.region, n)
		}
	}
	text := string(run(t, readEnv, cliBin, "nodes", "--broker-url", url))
	for _, w := range []string{"us-west-2", "eu-central-1", "ap-northeast-1", "h100-sxm5", "a100-80gb", "rtx-4090"} {
		if !strings.Contains(text, w) {
			t.Errorf("`gpupass nodes` lacks %q:\n%s", w, text)
		}
	}

	// The local endpoint answers with the fingerprint the broker indexed.
	for _, a := range agents {
		b, err := os.ReadFile(a.addrFile)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := testutil.HTTPClient(t).Get(strings.TrimSpace(string(b)) + "/v1/fingerprint")
		if err != nil {
			t.Fatal(err)
		}
		var fp struct {
			RuntimeFingerprint string `json:"runtime_fingerprint"`
			AgentID            string `json:"agent_id"`
			Simulated          bool   `json:"simulated"`
		}
		err = json.NewDecoder(resp.Body).Decode(&fp)
		resp.Body.Close()
		if err != nil || fp.RuntimeFingerprint != nodes[a.region].RuntimeFingerprint || fp.AgentID != nodes[a.region].ID || !fp.Simulated {
			t.Errorf("%s endpoint: %+v (err %v), broker indexed %+v", a.region, fp, err, nodes[a.region])
		}
	}
	for _, a := range agents {
		if s := a.p.Stderr(); strings.Contains(s, agentTok) {
			t.Errorf("agent %s logged its token", a.region)
		}
	}

	// Graceful stop, restart on the same state dir: same identity.
	eu := agents[1]
	eu.p.stop(t)
	waitFor(t, "the broker to mark the stopped node offline", func() (bool, string) {
		n := list()["eu-central-1"]
		return !n.Online, broker.Stderr()
	})
	startAgent(eu)
	time.Sleep(2 * time.Second)
	waitFor(t, "the restarted agent to report again", func() (bool, string) {
		n := list()
		return len(n) == 3 && n["eu-central-1"].Online, eu.p.Stderr()
	})
	if got := list()["eu-central-1"].ID; got != nodes["eu-central-1"].ID {
		t.Errorf("restarted agent is %s, was %s", got, nodes["eu-central-1"].ID)
	}
	for _, a := range agents {
		a.p.stop(t)
	}
	broker.stop(t)
}
