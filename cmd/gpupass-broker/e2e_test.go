//go:build e2e

package main_test

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Run(m)) }

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

type proc struct {
	cmd    *exec.Cmd
	stderr *bytes.Buffer
}

// serve starts the broker; env adds GPUPASS_* settings.
func serve(t *testing.T, bin, db, addr string, env ...string) *proc {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, "serve", "--listen", addr)
	cmd.Env = append(append(os.Environ(), "GPUPASS_DB="+db), env...)
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, stderr: &stderr}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _, _ = cmd.Process.Wait() })
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + addr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("broker did not come up: %v\n%s", err, stderr.String())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// stop sends SIGTERM and expects a clean, graceful exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	if err := p.cmd.Wait(); err != nil {
		t.Fatalf("broker exit after SIGTERM: %v\n%s", err, p.stderr.String())
	}
	if !strings.Contains(p.stderr.String(), "broker stopped") {
		t.Errorf("no graceful stop in the log:\n%s", p.stderr.String())
	}
}

func tokenCreate(t *testing.T, bin, db, role, regions string) string {
	t.Helper()
	cmd := exec.Command(bin, "--db", db, "token", "create", "--role", role, "--regions", regions)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("token create: %v\n%s", err, errb.String())
	}
	tok := strings.TrimSpace(out.String())
	if !strings.HasPrefix(tok, "gpp_") || strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("token create printed %q, want one token line", out.String())
	}
	return tok
}

func TestBrokerBinaries(t *testing.T) {
	broker := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	gpupass := testutil.BuildBinary(t, "./cmd/gpupass")
	for _, kind := range brokertest.Stores {
		t.Run(kind, func(t *testing.T) {
			db := brokertest.NewDB(t, kind).URL()
			agentTok := tokenCreate(t, broker, db, "agent", "*")
			readTok := tokenCreate(t, broker, db, "read", "us-*,eu-central-1")
			// Tokens are stored hashed: the database never holds the secret.
			if kind == "sqlite" {
				raw, err := os.ReadFile(strings.TrimPrefix(db, "sqlite://"))
				if err != nil {
					t.Fatal(err)
				}
				if bytes.Contains(raw, []byte(readTok)) {
					t.Error("token secret stored in the clear")
				}
			}
			addr := freePort(t)
			p := serve(t, broker, db, addr)
			url := "http://" + addr
			ids := map[string]string{}
			for _, region := range []string{"us-west-2", "eu-central-1", "ap-south-1"} {
				ids[region] = brokertest.Register(t, url, agentTok, brokertest.H100(region, 20)).ID
			}
			tokFile := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(tokFile, []byte(readTok+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			nodes := func() string {
				cmd := exec.Command(gpupass, "nodes")
				cmd.Env = append(os.Environ(), "GPUPASS_BROKER_URL="+url, "GPUPASS_BROKER_TOKEN_FILE="+tokFile)
				out, err := cmd.CombinedOutput()
				if err != nil {
					t.Fatalf("gpupass nodes: %v\n%s", err, out)
				}
				return string(out)
			}
			out := nodes()
			if !strings.Contains(out, ids["us-west-2"]) || !strings.Contains(out, ids["eu-central-1"]) || strings.Contains(out, ids["ap-south-1"]) {
				t.Errorf("gpupass nodes with a us-*,eu-central-1 token:\n%s", out)
			}
			p.stop(t)
			if strings.Contains(p.stderr.String(), readTok) || strings.Contains(p.stderr.String(), agentTok) {
				t.Error("a token appears in the broker log")
			}

			// Restart: the registry and the tokens are still there.
			p = serve(t, broker, db, addr)
			if out := nodes(); !strings.Contains(out, ids["us-west-2"]) {
				t.Errorf("registry lost across restart:\n%s", out)
			}
			cmd := exec.Command(gpupass, "nodes", "--broker-url", url, "--broker-token", "gpp_wrong")
			msg, err := cmd.CombinedOutput()
			if code := cmd.ProcessState.ExitCode(); err == nil || code != 2 || !strings.Contains(string(msg), "401") {
				t.Errorf("bad token: exit %d, %s; want 2 with 401", code, msg)
			}
			p.stop(t)
		})
	}
}

func TestServeRefusesBadFlags(t *testing.T) {
	broker := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	for _, args := range [][]string{
		{"--db", "mysql://x", "serve"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "serve", "--listen", "127.0.0.1:0", "--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "token", "create", "--role", "root", "--regions", "*"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "token", "create", "--role", "read"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "serve", "--listen", "127.0.0.1:0", "--max-body-memory-per-token", "1MiB"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "serve", "--listen", "127.0.0.1:0", "--body-min-rate", "fast"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "serve", "--listen", "127.0.0.1:0", "--admission", "eu-*=maybe"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "serve", "--listen", "127.0.0.1:0", "--dashboard-admin-reserve", "1000"},
		{"--db", "sqlite://" + filepath.Join(t.TempDir(), "b.db"), "serve", "--listen", "127.0.0.1:0", "--dashboard-sessions-per-token", "0"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := exec.CommandContext(ctx, broker, args...).CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), "gpupass-broker:") {
			t.Errorf("%v: err %v, output %s; want a clear refusal", args, err, out)
		}
	}
}
