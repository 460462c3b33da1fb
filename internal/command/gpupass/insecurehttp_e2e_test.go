//go:build e2e

package gpupass_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/testutil/netnstest"
	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// tokenRecorder is a "broker" on a non-loopback address: an HTTP/1 and
// h2c server that keeps every connection it accepts and every
// Authorization header it is sent, and answers 503.
type tokenRecorder struct {
	URL string

	mu     sync.Mutex
	conns  int
	tokens []string
	got    chan struct{} // closed at the first token
	once   sync.Once
}

func newTokenRecorder(t *testing.T, ns *netnstest.NS) *tokenRecorder {
	t.Helper()
	ln := ns.Listen(t, 0)
	r := &tokenRecorder{URL: "http://" + ln.Addr().String(), got: make(chan struct{})}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			if a := req.Header.Get("Authorization"); a != "" {
				r.mu.Lock()
				r.tokens = append(r.tokens, a)
				r.mu.Unlock()
				r.once.Do(func() { close(r.got) })
			}
			w.WriteHeader(http.StatusServiceUnavailable)
		}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				r.mu.Lock()
				r.conns++
				r.mu.Unlock()
			}
		},
		Protocols: new(http.Protocols),
	}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	return r
}

func (r *tokenRecorder) seen() (conns int, tokens []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.conns, append([]string(nil), r.tokens...)
}

// TestTokenNotOverPlainHTTP: the CLI and the agent, pointed at an http://
// broker on an address that is not loopback (inside a network namespace
// the test creates), refuse before they connect, with an error naming the
// URL and --insecure-http; given --insecure-http (or
// GPUPASS_INSECURE_HTTP=true) they send the token and warn. Issue #31:
// both sent the token without a word, the agent again and again.
func TestTokenNotOverPlainHTTP(t *testing.T) {
	ns := netnstest.New(t)
	cli := testutil.BuildBinary(t, "./cmd/gpupass")
	agentBin := testutil.BuildBinary(t, "./cmd/gpupass-agent")
	const token = "gpp_plainhttp_test_s3cret"
	refusal := []string{"refusing to send the broker token over plain HTTP to ", "is not a loopback address", "use an https:// broker URL"}
	warning := "the broker token goes over plain HTTP, unencrypted"

	tests := []struct {
		name    string
		agent   bool
		args    func(url string) []string
		env     func(url string) []string
		allowed bool
		// byName: the URL names the broker by a host name that resolves
		// to its address (an /etc/hosts of the command's own, in a mount
		// namespace), so the check at connect time is what refuses it.
		byName bool
		// fix is how the refusal names the consent (default: the flag).
		fix string
	}{
		{name: "cli nodes, flags", args: func(u string) []string {
			return []string{"nodes", "--broker-url", u, "--broker-token", token}
		}},
		{name: "cli runs, environment", args: func(string) []string { return []string{"runs"} },
			env: func(u string) []string { return []string{"GPUPASS_BROKER_URL=" + u, "GPUPASS_BROKER_TOKEN=" + token} }},
		{name: "cli nodes --insecure-http", allowed: true, args: func(u string) []string {
			return []string{"nodes", "--broker-url", u, "--broker-token", token, "--insecure-http"}
		}},
		{name: "cli runs GPUPASS_INSECURE_HTTP=true", allowed: true, args: func(string) []string { return []string{"runs"} },
			env: func(u string) []string {
				return []string{"GPUPASS_BROKER_URL=" + u, "GPUPASS_BROKER_TOKEN=" + token, "GPUPASS_INSECURE_HTTP=true"}
			}},
		// The CI step (the GitHub Action, the GitLab components): inputs
		// arrive as GPUPASS_* variables, consent too.
		{name: "compare-report step", fix: "--insecure-http (or GPUPASS_INSECURE_HTTP=true)", args: func(string) []string { return []string{"-o", "gitlab", "compare"} },
			env: func(u string) []string { return ciCompare(u, token) }},
		{name: "compare-report step GPUPASS_INSECURE_HTTP=true", allowed: true, args: func(string) []string { return []string{"-o", "gitlab", "compare"} },
			env: func(u string) []string { return append(ciCompare(u, token), "GPUPASS_INSECURE_HTTP=true") }},
		{name: "cli nodes, a host name", byName: true, args: func(u string) []string {
			return []string{"nodes", "--broker-url", u, "--broker-token", token}
		}},
		{name: "agent", agent: true, args: func(u string) []string { return []string{"--broker-url", u} }},
		{name: "agent, a host name", agent: true, byName: true, args: func(u string) []string { return []string{"--broker-url", u} }},
		{name: "agent --insecure-http", agent: true, allowed: true, args: func(u string) []string {
			return []string{"--broker-url", u, "--insecure-http"}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := newTokenRecorder(t, ns)
			home := t.TempDir()
			ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
			defer cancel()
			url := rec.URL
			var argv []string
			if tc.byName {
				const host = "broker.gpupass-test.invalid"
				hosts := filepath.Join(home, "hosts")
				if err := os.WriteFile(hosts, []byte("127.0.0.1 localhost\n"+ns.PeerIP+" "+host+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				url = strings.Replace(url, ns.PeerIP, host, 1)
				argv = []string{testutil.Tool(t, "unshare"), "--mount", "--", "sh", "-c", `mount --bind "$0" /etc/hosts && exec "$@"`, hosts}
			}
			if tc.agent {
				argv = append(append(argv, agentBin, "--broker-token", token, "--region", "r", "--state-dir", t.TempDir(), "--query-addr", "127.0.0.1:0",
					"--simulate", "h100-sxm5-8x", "--read-probe-mb", "1", "--no-work"), tc.args(url)...)
			} else {
				argv = append(append(argv, cli), tc.args(url)...)
			}
			cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
			cmd.Dir = home
			// A clean environment: no GPUPASS_* of the machine running the test.
			cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home}
			if tc.env != nil {
				cmd.Env = append(cmd.Env, tc.env(url)...)
			}
			var stdout, stderr testutil.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var err error
			if tc.agent && tc.allowed {
				// The agent retries a broker that answers 503: stop it
				// once the token has arrived.
				select {
				case <-rec.got:
					_ = cmd.Process.Kill()
					err = <-done
				case err = <-done:
				case <-ctx.Done():
					_ = cmd.Process.Kill()
					<-done
					t.Fatalf("no token arrived within the time limit\n%s", stderr.String())
				}
			} else {
				err = <-done
			}
			out := stdout.String() + stderr.String()
			conns, tokens := rec.seen()
			if tc.allowed {
				if len(tokens) == 0 || tokens[0] != "Bearer "+token {
					t.Errorf("with consent, the broker got tokens %q over %d connections, want the bearer token\n%s", tokens, conns, out)
				}
				if !strings.Contains(out, warning) || !strings.Contains(out, "--insecure-http") {
					t.Errorf("no plain HTTP warning naming --insecure-http:\n%s", out)
				}
				return
			}
			if conns != 0 || len(tokens) != 0 {
				t.Errorf("the broker at %s got %d connections and tokens %q: want none before consent\n%s", url, conns, tokens, out)
			}
			if err == nil {
				t.Errorf("exit 0, want a refusal\n%s", out)
			}
			fix := tc.fix
			if fix == "" {
				fix = "--insecure-http (or GPUPASS_INSECURE_HTTP=true)"
			}
			for _, w := range append(refusal, url, ns.PeerIP+" is not a loopback address", fix) {
				if !strings.Contains(out, w) {
					t.Errorf("output lacks %q:\n%s", w, out)
				}
			}
			if strings.Contains(out, token) {
				t.Errorf("output shows the token:\n%s", out)
			}
		})
	}
}

// ciCompare is the environment of a compare-report step (gpupass -o
// gitlab compare) that reads two runs by allocation id from the broker at
// url, outside any CI.
func ciCompare(url, token string) []string {
	return []string{"GPUPASS_RUNS=us=alloc-us eu=alloc-eu", "GPUPASS_BROKER_URL=" + url,
		"GPUPASS_BROKER_TOKEN=" + token, "GITHUB_ACTIONS=", "GITLAB_CI="}
}

// `gpupass up --listen ADDR` with ADDR off loopback (the network
// namespace's near end: an address of this machine that is not
// loopback) printed a ready line the plain HTTP rule refused when
// pasted. The ready line carries the consent; the other commands, from
// a subdirectory of the project, are refused naming it, and work after
// the export line up prints.
func TestE2EUpOffLoopbackPrintsCommandsThatWork(t *testing.T) {
	t.Parallel()
	ns := netnstest.New(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	bin := upstack.BuildAll(t)
	home := t.TempDir()
	proj := filepath.Join(home, "proj")
	environ := []string{"PATH=" + bin + ":" + os.Getenv("PATH"), "HOME=" + home}
	initCmd := exec.Command(filepath.Join(bin, "gpupass"), "init", proj)
	initCmd.Env = environ
	if out, err := initCmd.CombinedOutput(); err != nil {
		t.Fatalf("gpupass init: %v\n%s", err, out)
	}
	stack := upstack.Start(t, upstack.Options{Dir: proj, Environ: environ, DefaultStateDir: true, Args: []string{"--listen", ns.HostIP + ":0"}})
	if url := stack.Config(t).BrokerURL; !strings.Contains(url, "//"+ns.HostIP+":") {
		t.Fatalf("the stack's broker is at %s, want %s", url, ns.HostIP)
	}
	var ready, export string
	for _, l := range strings.Split(stack.Out.String(), "\n") {
		if r, ok := strings.CutPrefix(l, "ready: "); ok {
			ready = r
		}
		if _, e, ok := strings.Cut(l, "plain HTTP off loopback: "); ok {
			_, export, _ = strings.Cut(e, "or: ")
		}
	}
	if ready == "" || !strings.HasPrefix(export, "export ") {
		t.Fatalf("up printed no ready line or no export line:\n%s", stack.Out.String())
	}
	const refusal, warning = "refusing to send the broker token over plain HTTP", "the broker token goes over plain HTTP, unencrypted"

	out, code := shell(t, ctx, stack, proj, ready)
	if strings.Contains(out, refusal) || !strings.Contains(out, warning) {
		t.Errorf("%s, as pasted: exit %d, refused or not warned:\n%s", ready, code, upstack.Tail(out, 3000))
	}
	if exec.Command(upstack.Python, "-c", "import torch, numpy").Run() == nil && code != 0 {
		t.Errorf("%s, as pasted: exit %d\n%s", ready, code, upstack.Tail(out, 3000))
	}

	sub := filepath.Join(proj, "src")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	out, code = shell(t, ctx, stack, sub, "gpupass runs")
	if code != 2 || !strings.Contains(out, refusal) || !strings.Contains(out, "--insecure-http (or GPUPASS_INSECURE_HTTP=true)") {
		t.Errorf("gpupass runs without consent: exit %d, want 2 and the refusal naming the consent:\n%s", code, out)
	}
	out, code = shell(t, ctx, stack, sub, export+"\ngpupass runs")
	if code != 0 || !strings.Contains(out, warning) || !strings.Contains(out, "us-west-2") {
		t.Errorf("%s; gpupass runs: exit %d, want the run the ready line started, and the warning:\n%s", export, code, out)
	}
}
