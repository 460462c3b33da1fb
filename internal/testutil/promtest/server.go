package promtest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// Server is a real Prometheus server (Debian's prometheus) on a loopback
// port, with its config and storage in a temporary directory.
type Server struct {
	URL string
	Log string // its stderr, logged if the test fails
	cmd *exec.Cmd
}

// StartPrometheus writes config (a prometheus.yml) to a temporary
// directory and starts prometheus on it; it is stopped by its PID when the
// test ends.
func StartPrometheus(t testing.TB, config string) *Server {
	t.Helper()
	bin := testutil.Tool(t, "prometheus")
	dir := t.TempDir()
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	// Prometheus takes an address, not a listener: find a free port and
	// hand it over (another process could take it in between: rare on
	// loopback, and the start below then fails loudly).
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	s := &Server{URL: "http://" + addr, Log: filepath.Join(dir, "prometheus.log")}
	lf, err := os.Create(s.Log)
	if err != nil {
		t.Fatal(err)
	}
	s.cmd = exec.Command(bin, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn")
	s.cmd.Stdout, s.cmd.Stderr = lf, lf
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := s.cmd.Start(); err != nil {
		lf.Close()
		t.Fatalf("starting prometheus: %v", err)
	}
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); lf.Close(); close(done) }()
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM) // by PID: this process only
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = s.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			b, _ := os.ReadFile(s.Log)
			t.Logf("--- prometheus log\n%s", b)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(s.URL + "/-/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s
			}
		}
		select {
		case <-done:
			b, _ := os.ReadFile(s.Log)
			t.Fatalf("prometheus exited at start:\n%s", b)
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("prometheus not ready within 30s")
		}
	}
}

// Query evaluates an instant PromQL query over the HTTP API and returns
// the value of its single sample; ok is false when the result is empty.
func (s *Server) Query(ctx context.Context, promql string) (v float64, ok bool, err error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL+"/api/v1/query?query="+url.QueryEscape(promql), nil)
	if err != nil {
		return 0, false, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, false, err
	}
	defer resp.Body.Close()
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string `json:"resultType"`
			Result     []struct {
				Value [2]any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return 0, false, fmt.Errorf("query %q: decoding the answer: %w", promql, err)
	}
	if r.Status != "success" {
		return 0, false, fmt.Errorf("query %q: %s", promql, r.Error)
	}
	if r.Data.ResultType != "vector" || len(r.Data.Result) == 0 {
		return 0, false, nil
	}
	if len(r.Data.Result) > 1 {
		return 0, false, fmt.Errorf("query %q: %d samples, want one (aggregate it)", promql, len(r.Data.Result))
	}
	str, _ := r.Data.Result[0].Value[1].(string)
	v, err = strconv.ParseFloat(str, 64)
	return v, true, err
}
