package executor_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent/executor"
	"github.com/gpupass/gpupass/internal/events"
	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
)

// fakePython is a real interpreter that sees a site dir holding the
// distributions given (name -> version), as importlib.metadata reads them:
// a venv of python3 (the agent starts the node's interpreter isolated, so
// a PYTHONPATH would not reach it).
func fakePython(t *testing.T, dists map[string]string) string {
	t.Helper()
	py := testutil.Tool(t, "python3")
	venv := filepath.Join(t.TempDir(), "venv")
	if out, err := exec.Command(py, "-I", "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		t.Fatalf("creating a venv: %v\n%s", err, out)
	}
	sites, err := filepath.Glob(filepath.Join(venv, "lib", "python3*", "site-packages"))
	if err != nil || len(sites) != 1 {
		t.Fatalf("the venv's site-packages: %v %v", sites, err)
	}
	for name, ver := range dists {
		d := filepath.Join(sites[0], name+"-"+ver+".dist-info")
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		meta := "Metadata-Version: 2.1\nName: " + name + "\nVersion: " + ver + "\n"
		if err := os.WriteFile(filepath.Join(d, "METADATA"), []byte(meta), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(venv, "bin", "python")
}

func TestRuntimeInitPackages(t *testing.T) {
	t.Parallel()
	py := fakePython(t, map[string]string{"transformers": "4.30.0", "flash_attn": "2.5.5", "torchlocal": "2.1.0+cu121"})
	type ev struct {
		Level   events.Level
		Message string
	}
	tests := []struct {
		name     string
		packages []string
		state    executor.State
		reason   string
		want     []ev
	}{
		{"all match", []string{"Flash-Attn==2.5.5", "torchlocal==2.1.0+cu121"}, executor.Succeeded, "exited with status 0", []ev{
			{events.Info, "package Flash-Attn 2.5.5 (expected 2.5.5)"},
			{events.Info, "package torchlocal 2.1.0+cu121 (expected 2.1.0+cu121)"},
		}},
		{"version and local label mismatches, missing package", []string{"transformers==4.38.2", "flash-attn==2.5.5", "torchlocal==2.1.0+cu118", "absent-pkg==1.0"},
			executor.Failed, "runtime-init: package mismatch: absent-pkg expected 1.0, not installed; torchlocal expected 2.1.0+cu118, installed 2.1.0+cu121; transformers expected 4.38.2, installed 4.30.0", []ev{
				{events.Error, "package absent-pkg: expected 1.0, not installed"},
				{events.Info, "package flash-attn 2.5.5 (expected 2.5.5)"},
				{events.Error, "package torchlocal: expected 2.1.0+cu118, installed 2.1.0+cu121"},
				{events.Error, "package transformers: expected 4.38.2, installed 4.30.0"},
			}},
		{"unpinned is not checked", []string{"transformers>=4"}, executor.Succeeded, "exited with status 0", []ev{
			{events.Warn, "package transformers is not pinned with ==; not checked"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			marker := filepath.Join(t.TempDir(), "ran")
			job := executor.Job{Command: []string{"touch", marker}, Python: py, Spec: &spec.Spec{Runtime: spec.Runtime{Packages: tt.packages}}}
			out := execute(t, context.Background(), job, nil)
			if out.res.State != tt.state || out.res.Reason != tt.reason {
				t.Errorf("result %s %q, want %s %q", out.res.State, out.res.Reason, tt.state, tt.reason)
			}
			var got []ev
			for _, e := range out.find(events.RuntimeInit) {
				if strings.HasPrefix(e.Message, "package ") {
					got = append(got, ev{e.Level, e.Message})
				}
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("runtime.init events (-want +got):\n%s", d)
			}
			_, err := os.Stat(marker)
			if ran := err == nil; ran != (tt.state == executor.Succeeded) {
				t.Errorf("command ran = %v with state %s: a mismatch must stop the run before the command", ran, out.res.State)
			}
		})
	}
}

func TestRuntimeInitNoPython(t *testing.T) {
	t.Parallel()
	job := executor.Job{Command: []string{"true"}, Python: "/nonexistent/python3", Spec: &spec.Spec{Runtime: spec.Runtime{Packages: []string{"a==1"}}}}
	out := execute(t, context.Background(), job, nil)
	if out.res.State != executor.Failed || !strings.Contains(out.res.Reason, "runtime-init: the run's Python is not usable: not found: /nonexistent/python3") {
		t.Errorf("result %+v", out.res)
	}
}

func TestRuntimeChecks(t *testing.T) {
	t.Parallel()
	ok := executor.RuntimeCheck{Name: "conformance", Run: func(context.Context, executor.Job) (string, error) { return "18 checks passed (cached)", nil }}
	busy := executor.RuntimeCheck{Name: "gpu.foreign-processes", Run: func(_ context.Context, j executor.Job) (string, error) {
		return "", fmt.Errorf("GPU 0 is held by pid 4242 (not part of %s)", j.AllocID)
	}}
	tests := []struct {
		name   string
		checks []executor.RuntimeCheck
		state  executor.State
		reason string
		want   []string
	}{
		{"all pass", []executor.RuntimeCheck{ok}, executor.Succeeded, "exited with status 0", []string{"INFO conformance: 18 checks passed (cached)"}},
		{"a check refuses", []executor.RuntimeCheck{ok, busy}, executor.Failed, "runtime-init: gpu.foreign-processes: GPU 0 is held by pid 4242 (not part of alloc-0000test)",
			[]string{"INFO conformance: 18 checks passed (cached)", "ERROR gpu.foreign-processes: GPU 0 is held by pid 4242 (not part of alloc-0000test)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			marker := filepath.Join(t.TempDir(), "ran")
			out := execute(t, context.Background(), executor.Job{Command: []string{"touch", marker}}, &executor.Executor{Checks: tt.checks})
			if out.res.State != tt.state || out.res.Reason != tt.reason {
				t.Errorf("result %s %q, want %s %q", out.res.State, out.res.Reason, tt.state, tt.reason)
			}
			var got []string
			for _, e := range out.find(events.RuntimeInit) {
				if e.Fields["check"] != "" {
					got = append(got, e.Level.String()+" "+e.Message)
				}
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("(-want +got):\n%s", d)
			}
			if _, err := os.Stat(marker); (err == nil) != (tt.state == executor.Succeeded) {
				t.Errorf("command ran = %v with state %s", err == nil, tt.state)
			}
		})
	}
}

// TestRuntimePrepare: a Prepare step changes the job the command runs
// as (command, environment), records its own events, and its failure
// stops the run before the command.
func TestRuntimePrepare(t *testing.T) {
	t.Parallel()
	rewrite := executor.RuntimeCheck{Name: "bundle", Prepare: func(_ context.Context, j *executor.Job, emit executor.Emit) (string, error) {
		emit(events.Info, events.RuntimeBundle, "installed demo 1.0", map[string]string{"package": "demo"})
		j.Command = []string{"sh", "-c", `echo "prepared $PREPARED"`}
		j.BaseEnv = append(os.Environ(), "PREPARED=yes")
		return "environment ready", nil
	}}
	broken := executor.RuntimeCheck{Name: "bundle", Prepare: func(context.Context, *executor.Job, executor.Emit) (string, error) {
		return "", fmt.Errorf("pulling bundle: HTTP 404")
	}}
	tests := []struct {
		name   string
		check  executor.RuntimeCheck
		state  executor.State
		reason string
		stdout []string
		bundle []string
	}{
		{"changes the job", rewrite, executor.Succeeded, "exited with status 0", []string{"prepared yes"}, []string{"installed demo 1.0"}},
		{"fails the run", broken, executor.Failed, "runtime-init: bundle: pulling bundle: HTTP 404", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out := execute(t, context.Background(), executor.Job{Command: []string{"echo", "original"}}, &executor.Executor{Checks: []executor.RuntimeCheck{tt.check}})
			if out.res.State != tt.state || out.res.Reason != tt.reason {
				t.Errorf("result %s %q, want %s %q", out.res.State, out.res.Reason, tt.state, tt.reason)
			}
			var stdout, bundle []string
			for _, e := range out.find(events.StdoutComponent) {
				stdout = append(stdout, e.Message)
			}
			for _, e := range out.find(events.RuntimeBundle) {
				bundle = append(bundle, e.Message)
			}
			if d := cmp.Diff(tt.stdout, stdout); d != "" {
				t.Errorf("stdout (-want +got):\n%s", d)
			}
			if d := cmp.Diff(tt.bundle, bundle); d != "" {
				t.Errorf("runtime.bundle events (-want +got):\n%s", d)
			}
		})
	}
}

// TestRuntimeInitReusesMeasurement: when a runtime-init check already
// measured the run's Python (the run report does), the package check reads
// that measurement instead of starting the interpreter and importing torch
// again; one made for another interpreter is not reused. The interpreter
// here does not exist, so only a reused measurement can pass.
func TestRuntimeInitReusesMeasurement(t *testing.T) {
	t.Parallel()
	const py = "/nonexistent/python3"
	measured := func(exe string) executor.RuntimeCheck {
		return executor.RuntimeCheck{Name: "conformance", Prepare: func(_ context.Context, j *executor.Job, _ executor.Emit) (string, error) {
			j.Measured = &executor.MeasuredPython{Exe: exe, Section: probe.PythonSection{Found: true, Version: "3.11.2",
				Executable: exe, Packages: map[string]string{"flash-attn": "2.5.5"}}}
			return "measured", nil
		}}
	}
	tests := []struct {
		name   string
		exe    string
		state  executor.State
		reason string
	}{
		{"same interpreter", py, executor.Succeeded, "exited with status 0"},
		{"another interpreter", "/other/python3", executor.Failed, "runtime-init: the run's Python is not usable: not found: /nonexistent/python3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			job := executor.Job{Command: []string{"true"}, Python: py, Spec: &spec.Spec{Runtime: spec.Runtime{Packages: []string{"Flash_Attn==2.5.5"}}}}
			out := execute(t, context.Background(), job, &executor.Executor{Checks: []executor.RuntimeCheck{measured(tt.exe)}})
			if out.res.State != tt.state || !strings.Contains(out.res.Reason, tt.reason) {
				t.Errorf("result %s %q, want %s %q", out.res.State, out.res.Reason, tt.state, tt.reason)
			}
		})
	}
}
