//go:build e2e

package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/testutil"
	"github.com/gpupass/gpupass/internal/wheel"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// TestPinRuleValidateLocalAgreesWithAgent builds a real venv holding
// versions that a string compare gets wrong (2.4.0+cu121 under ==2.4.0,
// 1.26.0 under ==1.26) and one real mismatch, then asks both
// `gpupass validate --local --python VENV/bin/python` (the real binary)
// and the agent's run report for the same spec and interpreter: both must
// say "match" for the first two and "mismatch" for the third (issue #19).
func TestPinRuleValidateLocalAgreesWithAgent(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat(systemPython); err != nil {
		testutil.Missing(t, "%s", systemPython)
	}
	dir := t.TempDir()
	venv := filepath.Join(dir, "venv")
	if b, err := exec.Command(systemPython, "-m", "venv", "--without-pip", venv).CombinedOutput(); err != nil {
		testutil.Missing(t, "python3 -m venv (python3-venv): %v\n%s", err, b)
	}
	py := filepath.Join(venv, "bin", "python")
	out, err := exec.Command(py, "-I", "-c", `import sysconfig, json; print(json.dumps(sysconfig.get_paths()))`).Output()
	if err != nil {
		t.Fatalf("asking the venv for its scheme: %v", err)
	}
	var paths map[string]string
	if err := json.Unmarshal(out, &paths); err != nil {
		t.Fatal(err)
	}
	in := &wheel.Installer{Scheme: wheel.Scheme{Purelib: paths["purelib"], Platlib: paths["platlib"],
		Scripts: paths["scripts"], Data: paths["data"], Headers: filepath.Join(dir, "include"), Python: py}}
	// Installed version of each tiny distribution; the spec pins below.
	installed := []struct{ dist, version string }{
		{"pin-local", "2.4.0+cu121"}, // a CUDA build of a public pin
		{"pin-pad", "1.26.0"},        // release padding
		{"pin-off", "3.1.0"},         // a real mismatch
	}
	for _, d := range installed {
		file := fmt.Sprintf("%s-%s-py3-none-any.whl", strings.ReplaceAll(d.dist, "-", "_"), d.version)
		p, err := wheeltest.Write(dir, file, d.dist, d.version, nil, wheeltest.Options{})
		if err != nil {
			t.Fatal(err)
		}
		f, err := wheel.ParseFilename(file)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := in.Install(p, f); err != nil {
			t.Fatalf("installing %s: %v", file, err)
		}
	}
	specYAML := strings.Replace(wheeltest.SpecYAML, "    - alpha==1.0\n    - beta-pkg==2.0\n",
		"    - pin-local==2.4.0\n    - pin-pad==1.26\n    - pin-off==3.0\n", 1)
	specPath := filepath.Join(dir, "gpupass.yaml")
	if err := os.WriteFile(specPath, []byte(specYAML), 0o644); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"pin-local": "match", "pin-off": "mismatch", "pin-pad": "match"}

	t.Run("validate --local", func(t *testing.T) {
		bin := testutil.BuildBinary(t, "./cmd/gpupass")
		cmd := exec.Command(bin, "validate", "--spec", specPath, "--local", "--python", py, "--output", "json")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		_ = cmd.Run() // exits non-zero: the driver and CUDA differ here too
		var doc struct {
			Local struct {
				Measured struct {
					Packages map[string]string `json:"packages"`
				} `json:"measured"`
				Mismatches []struct {
					Field, Expected, Got string
				} `json:"mismatches"`
			} `json:"local"`
		}
		if err := json.Unmarshal(stdout.Bytes(), &doc); err != nil {
			t.Fatalf("validate --local output is not JSON: %v\nstdout: %s\nstderr: %s", err, stdout.Bytes(), stderr.Bytes())
		}
		got := map[string]string{}
		for n := range want {
			if doc.Local.Measured.Packages[n] == "" {
				t.Fatalf("validate --local measured no %s in %s: %+v", n, py, doc.Local.Measured.Packages)
			}
			got[n] = "match"
		}
		for _, m := range doc.Local.Mismatches {
			if n, ok := strings.CutPrefix(m.Field, "runtime.packages."); ok {
				got[n] = "mismatch"
				t.Logf("validate --local: %s expected %s, got %s", n, m.Expected, m.Got)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("validate --local verdicts (-want +got):\n%s", diff)
		}
	})

	t.Run("agent run report", func(t *testing.T) {
		res := spec.Validate(specPath, []byte(specYAML))
		if !res.Valid {
			t.Fatalf("spec not valid: %+v", res)
		}
		o := &agent.Options{
			BrokerURL: "http://127.0.0.1:1", Token: "unused", StateDir: t.TempDir(), QueryAddr: "127.0.0.1:0",
			Provider: "sim", Region: "us-west-2", Zone: "us-west-2a", PricePerHour: 2.5, StorageClass: "standard", BandwidthGbps: 25,
			Python: py, Simulate: "a100-80gb-4x", SuiteInterval: time.Hour, ReadProbeMB: 1,
		}
		if err := o.Validate(true); err != nil {
			t.Fatal(err)
		}
		a, err := agent.New(o, slog.New(slog.NewTextHandler(io.Discard, nil)))
		if err != nil {
			t.Fatal(err)
		}
		sr, err := a.RunReport(context.Background(), "alloc-pin", res.Spec, py, nil)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]string{}
		for _, c := range sr.Report.Checks {
			n, ok := strings.CutPrefix(c.Name, "package.")
			if !ok {
				continue
			}
			got[n] = "match"
			if c.Status != conformance.Pass {
				got[n] = "mismatch"
				t.Logf("agent: %s %s: expected %s, got %s (%s)", n, c.Status, c.Expected, c.Actual, c.Message)
			}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("agent verdicts (-want +got):\n%s", diff)
		}
	})
}
