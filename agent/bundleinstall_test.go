package agent

import (
	"context"
	"encoding/json"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/registry"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/agent/executor/local"
	"github.com/gpupass/gpupass/agent/spool"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil/regtest"
)

// bundleEvents are the stored events of component runtime.bundle.
func (m *memSource) bundleEvents(t *testing.T) []events.Event {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []events.Event
	for seq := uint64(1); seq <= uint64(len(m.recs)); seq++ {
		r := m.recs[seq]
		if r.Kind != spool.KindEvent {
			continue
		}
		ev, err := executor.DecodeEvent(r)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Component == events.RuntimeBundle {
			out = append(out, ev)
		}
	}
	return out
}

func push(ctx context.Context, t *testing.T, house, ref string, reg bundle.RegistryOptions) bundle.PushResult {
	t.Helper()
	ws, err := bundle.Scan(ctx, house, bundle.ScanOptions{Jobs: 2})
	if err != nil {
		t.Fatal(err)
	}
	res, err := bundle.Push(ctx, ref, ws, bundle.PushOptions{Registry: reg})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func specJSON(t *testing.T, s spec.Spec) []byte {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBundleInstallThroughTheRunLoop drives the agent's run loop with a
// real registry server and real wheels built by pip: the bundle is pulled
// by digest into the run's work dir, installed with pip --no-index into a
// venv, the package check passes in that venv and the command imports the
// package, while the node's own Python stays without it.
func TestBundleInstallThroughTheRunLoop(t *testing.T) {
	t.Parallel()
	py := regtest.SystemPython(t)
	host := regtest.StartRegistry(t)
	house := regtest.BuildWheels(t, py, map[string]string{"gp-alpha": "1.0.0", "gp-beta": "2.1"})
	ctx := t.Context()
	reg := bundle.RegistryOptions{PlainHTTP: true}
	pushed := push(ctx, t, house, host+"/ml/wheels:v1", reg)
	// numpy is not in the bundle: the node's Python provides it.
	pins := []string{"gp-alpha==1.0.0", "gp_beta==2.1", "numpy==1.24.2"}
	offline := func(ref string, pkgs ...string) spec.Spec {
		return spec.Spec{Name: "offline", Runtime: spec.Runtime{Bundle: ref, Packages: pkgs}, Security: spec.Security{NoInternetAccess: true}}
	}
	importAlpha := []string{py, "-c", "import gp_alpha, gp_beta; print('job says', gp_alpha.hello(), '+', gp_beta.hello())"}
	tests := []struct {
		name       string
		spec       spec.Spec
		command    []string
		wantStates []AllocState
		wantReason string
		// wantBundle are substrings of the runtime.bundle events, in order.
		wantBundle []string
		wantMsgs   []string
		notMsgs    []string
	}{
		{
			name:       "pulled by digest, installed, imported by the command",
			spec:       offline(pushed.Reference, pins...),
			command:    importAlpha,
			wantStates: []AllocState{StateStarting, StateRunning, StateSucceeded},
			wantBundle: []string{
				"pulling bundle " + pushed.Reference,
				"bundle " + pushed.Reference + " pulled and verified: 2 wheels",
				"installed gp-alpha 1.0.0 from gp_alpha-1.0.0-py3-none-any.whl (bundle " + pushed.Digest + ")",
				"installed gp-beta 2.1 from gp_beta-2.1-py3-none-any.whl (bundle " + pushed.Digest + ")",
				"package numpy==1.24.2 already provided by the node's Python",
				"command runs in the bundle's environment: " + py + " -> ",
			},
			wantMsgs: []string{"job says gp-alpha 1.0.0 + gp-beta 2.1", "package gp-alpha 1.0.0 (expected 1.0.0)"},
		},
		{
			name:       "a bare python3 command runs in the venv too",
			spec:       offline(pushed.Reference, "gp-alpha==1.0.0"),
			command:    []string{"sh", "-c", `exec python3 -c 'import gp_alpha, sys; print("via PATH", gp_alpha.hello(), sys.prefix != sys.base_prefix)'`},
			wantStates: []AllocState{StateStarting, StateRunning, StateSucceeded},
			wantMsgs:   []string{"via PATH gp-alpha 1.0.0 True"},
		},
		{
			name:       "a tag is refused for a no-internet spec",
			spec:       offline(host+"/ml/wheels:v1", pins...),
			command:    []string{"sh", "-c", "echo must-not-run"},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantReason: "is a tag: a run with security.no-internet-access installs only a bundle pinned by digest",
			wantBundle: []string{"is a tag"},
			notMsgs:    []string{"must-not-run"},
		},
		{
			name:       "no-internet-access without a bundle fails the run",
			spec:       offline("", pins...),
			command:    []string{"sh", "-c", "echo must-not-run"},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantReason: "no runtime.bundle",
			notMsgs:    []string{"must-not-run"},
		},
		{
			name:       "a pinned package the bundle lacks fails before the command",
			spec:       offline(pushed.Reference, "gp-alpha==1.0.0", "gp-missing==3.0"),
			command:    []string{"sh", "-c", "echo must-not-run"},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantReason: "gp-missing==3.0",
			notMsgs:    []string{"must-not-run"},
		},
		{
			name:       "a digest the registry does not have",
			spec:       offline(host+"/ml/wheels@sha256:"+strings.Repeat("ab", 32), pins...),
			command:    []string{"sh", "-c", "echo must-not-run"},
			wantStates: []AllocState{StateStarting, StateFailed},
			wantReason: "HTTP 404",
			notMsgs:    []string{"must-not-run"},
		},
		{
			name:       "a spec without a bundle installs nothing",
			spec:       spec.Spec{Name: "online", Runtime: spec.Runtime{Packages: []string{"numpy==1.24.2"}}},
			command:    []string{"sh", "-c", "echo plain run"},
			wantStates: []AllocState{StateStarting, StateRunning, StateSucceeded},
			wantMsgs:   []string{"plain run"},
			notMsgs:    []string{"pulling bundle"},
		},
	}
	// The node's Python was not touched: the bundle lives in the runs'
	// venvs only. (Cleanup: it runs after the parallel subtests.)
	t.Cleanup(func() {
		if err := exec.Command(py, "-c", "import gp_alpha").Run(); err == nil {
			t.Errorf("%s imports gp_alpha after the runs: the bundle leaked into the node's Python", py)
		}
	})
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newMemSource()
			l := &RunLoop{
				Source: src, AgentID: func() string { return "agent-1" },
				Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
				StateDir: t.TempDir(), Python: py,
				UpdateEvery: 50 * time.Millisecond, DrainTimeout: 10 * time.Second,
				Bundles: BundleInstaller{Registry: reg},
			}
			a := &Assignment{AllocID: "alloc-bundle01", FencingToken: 3, Command: tc.command, Spec: specJSON(t, tc.spec)}
			final := l.RunAssignment(ctx, a)
			if diff := cmp.Diff(tc.wantStates, src.states()); diff != "" {
				t.Errorf("states (-want +got):\n%s\nreason: %s", diff, final.Reason)
			}
			if !strings.Contains(final.Reason, tc.wantReason) {
				t.Errorf("final reason %q does not say %q", final.Reason, tc.wantReason)
			}
			evs := src.bundleEvents(t)
			i := 0
			for _, ev := range evs {
				if i < len(tc.wantBundle) && strings.Contains(ev.Message, tc.wantBundle[i]) {
					i++
				}
			}
			if i < len(tc.wantBundle) {
				var got []string
				for _, ev := range evs {
					got = append(got, ev.Message)
				}
				t.Errorf("no runtime.bundle event says %q (in order); got %q", tc.wantBundle[i], got)
			}
			msgs := src.messages(t)
			for _, w := range tc.wantMsgs {
				if !contains(msgs, w) {
					t.Errorf("no event says %q; events: %q", w, msgs)
				}
			}
			for _, w := range tc.notMsgs {
				if contains(msgs, w) {
					t.Errorf("an event says %q, which must not happen", w)
				}
			}
		})
	}
}

// TestBundleInstallCredentials: the agent's registry credentials reach a
// registry that demands them, and appear in no event.
func TestBundleInstallCredentials(t *testing.T) {
	t.Parallel()
	py := regtest.SystemPython(t)
	const user, pass = "ci-bot", "s3cret-registry-token"
	reg := registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if u, p, ok := r.BasicAuth(); !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		reg.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	host := strings.TrimPrefix(srv.URL, "http://")
	house := regtest.BuildWheels(t, py, map[string]string{"gp-delta": "0.4"})
	ctx := t.Context()
	good := bundle.RegistryOptions{PlainHTTP: true, Username: user, Password: pass}
	pushed := push(ctx, t, house, host+"/secure/wheels:v1", good)
	sp := spec.Spec{Name: "offline", Runtime: spec.Runtime{Bundle: pushed.Reference, Packages: []string{"gp-delta==0.4"}}, Security: spec.Security{NoInternetAccess: true}}
	for _, tc := range []struct {
		name      string
		reg       bundle.RegistryOptions
		wantState AllocState
		reason    string
	}{
		{"with the agent's credentials", good, StateSucceeded, "exited with status 0"},
		{"with wrong credentials", bundle.RegistryOptions{PlainHTTP: true, Username: user, Password: "wrong-" + pass}, StateFailed, "HTTP 401"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := newMemSource()
			l := &RunLoop{
				Source: src, AgentID: func() string { return "agent-1" },
				Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
				StateDir: t.TempDir(), Python: py, UpdateEvery: 50 * time.Millisecond, DrainTimeout: 10 * time.Second,
				Bundles: BundleInstaller{Registry: tc.reg},
			}
			a := &Assignment{AllocID: "alloc-cred0001", FencingToken: 1, Command: []string{py, "-c", "import gp_delta; print(gp_delta.hello())"}, Spec: specJSON(t, sp)}
			final := l.RunAssignment(ctx, a)
			if final.State != tc.wantState || !strings.Contains(final.Reason, tc.reason) {
				t.Errorf("final %s (%s), want %s saying %q", final.State, final.Reason, tc.wantState, tc.reason)
			}
			msgs := src.messages(t)
			for _, m := range append(msgs, final.Reason) {
				if strings.Contains(m, pass) {
					t.Errorf("the registry password appears in %q", m)
				}
			}
			if tc.wantState == StateSucceeded && !contains(msgs, "gp-delta 0.4") {
				t.Errorf("the job did not import the bundle's package: %q", msgs)
			}
		})
	}
}

// TestBundleInstallHidesAgentSecrets: a wheel can bring code that runs
// at every start (a .pth file), and the command runs it; it may not see
// the agent's token or registry password, and the agent's own
// interpreter starts (the venv, its layout) ignore PYTHONPATH. A sitecustomize on PYTHONPATH records what each
// Python process saw. Not parallel: it sets the agent's environment.
func TestBundleInstallHidesAgentSecrets(t *testing.T) {
	py := regtest.SystemPython(t)
	host := regtest.StartRegistry(t)
	house := regtest.BuildWheels(t, py, map[string]string{"gp-eta": "1.0"})
	ctx := t.Context()
	reg := bundle.RegistryOptions{PlainHTTP: true}
	pushed := push(ctx, t, house, host+"/ml/secret-wheels:v1", reg)

	const secret = "gpa_supersecret"
	for _, k := range []string{"GPUPASS_TOKEN", "GPUPASS_TOKEN_FILE", "GPUPASS_REGISTRY_PASSWORD", "GPUPASS_REGISTRY_PASSWORD_FILE"} {
		t.Setenv(k, secret+"-"+k)
	}
	hook := t.TempDir()
	if err := os.WriteFile(filepath.Join(hook, "sitecustomize.py"), []byte(`import os, sys
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "seen-%d" % os.getpid()), "w") as f:
    f.write(" ".join(getattr(sys, "argv", [])) + "\n")
    for k, v in os.environ.items():
        if k.startswith("GPUPASS_"):
            f.write(k + "=" + v + "\n")
`), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PYTHONPATH", hook)

	src := newMemSource()
	l := &RunLoop{
		Source: src, AgentID: func() string { return "agent-1" },
		Executor: &executor.Executor{Runner: local.ProcessRunner{}, Host: &local.Host{}},
		StateDir: t.TempDir(), Python: py, UpdateEvery: 50 * time.Millisecond, DrainTimeout: 10 * time.Second,
		Bundles: BundleInstaller{Registry: reg},
	}
	sp := spec.Spec{Name: "offline", Runtime: spec.Runtime{Bundle: pushed.Reference, Packages: []string{"gp-eta==1.0"}}, Security: spec.Security{NoInternetAccess: true}}
	a := &Assignment{AllocID: "alloc-secret01", FencingToken: 1, Spec: specJSON(t, sp),
		Command: []string{py, "-c", "import os, gp_eta; print('job-ran', gp_eta.hello(), os.environ.get('GPUPASS_TOKEN'))", "job-marker"}}
	if final := l.RunAssignment(ctx, a); final.State != StateSucceeded {
		t.Fatalf("run %s: %s", final.State, final.Reason)
	}
	for _, m := range src.messages(t) {
		if strings.Contains(m, secret) {
			t.Errorf("an event carries the agent's secret: %q", m)
		}
	}
	seen, err := filepath.Glob(filepath.Join(hook, "seen-*"))
	if err != nil {
		t.Fatal(err)
	}
	var agentSide, job bool
	for _, p := range seen {
		b, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		argv, _, _ := strings.Cut(s, "\n")
		job = job || strings.Contains(argv, "job-marker")
		agentSide = agentSide || !strings.Contains(argv, "job-marker")
		if strings.Contains(s, secret) {
			t.Errorf("a Python process started for the run saw the agent's secrets: %q", s)
		}
	}
	// The agent starts its interpreters isolated (-I), so PYTHONPATH's
	// hook runs in the command alone.
	if !job || agentSide {
		t.Errorf("the hook recorded the command: %t, a process of the agent: %t (%d processes); want only the command", job, agentSide, len(seen))
	}
}
