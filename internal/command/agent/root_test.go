package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	daemon "github.com/gpupass/gpupass/agent"
	"github.com/gpupass/gpupass/internal/conformance"
)

func TestCheckCommand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  []string
	}{
		{"simulated h100", []string{"--simulate", "h100-sxm5-8x"}, ExitOK, []string{"PASS    gpu.count", "simulated: true (profile h100-sxm5-8x)"}},
		{"simulated 4090", []string{"--simulate", "rtx-4090-1x"}, ExitOK, []string{"nvlink.state", "no NVLink"}},
		{"unknown profile", []string{"--simulate", "tpu-v5"}, ExitUsage, nil},
		{"profile file", []string{"--simulate", "../../../agent/testdata/l40s-2x.json"}, ExitOK, []string{"l40s", "simulated: true (profile l40s-2x)", "Gen4 x16 on 2"}},
		{"broken profile file", []string{"--simulate", "../../../agent/testdata/h100.yaml"}, ExitUsage, nil},
		{"bad storage class", []string{"--simulate", "h100-sxm5-8x", "--storage-class", "floppy"}, ExitUsage, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errw bytes.Buffer
			args := append([]string{"check", "--state-dir", t.TempDir(), "--read-probe-mb", "1"}, tt.args...)
			code := Main(context.Background(), args, &out, &errw)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.wantCode, out.String(), errw.String())
			}
			for _, w := range tt.wantOut {
				if !strings.Contains(out.String(), w) {
					t.Errorf("stdout lacks %q:\n%s", w, out.String())
				}
			}
		})
	}
}

// TestCheckNoGPU runs the real NVML binding: on a machine without the
// driver the node has nothing to offer and says why.
func TestCheckNoGPU(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/driver/nvidia/version"); err == nil {
		t.Skip("an NVIDIA driver is loaded here")
	}
	var out, errw bytes.Buffer
	code := Main(context.Background(), []string{"check", "--state-dir", t.TempDir(), "--read-probe-mb", "1", "--python", filepath.Join(t.TempDir(), "nopython")}, &out, &errw)
	if code != ExitFindings {
		t.Errorf("exit %d, want %d", code, ExitFindings)
	}
	for _, w := range []string{"FAIL    gpu.count", "no GPUs: NVML not available: ", "note: NVML not available: "} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("stdout lacks %q:\n%s", w, out.String())
		}
	}
}

func TestCheckJSONSigned(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	var out, errw bytes.Buffer
	code := Main(context.Background(), []string{"check", "--state-dir", dir, "--read-probe-mb", "1", "--simulate", "a100-80gb-4x", "-o", "json", "--region", "eu-central-1"}, &out, &errw)
	if code != ExitOK {
		t.Fatalf("exit %d: %s", code, errw.String())
	}
	var got struct {
		Report    json.RawMessage `json:"report"`
		Signature string          `json:"signature"`
	}
	if err := json.Unmarshal(out.Bytes(), &got); err != nil {
		t.Fatalf("stdout is not one JSON document: %v\n%s", err, out.String())
	}
	pub, err := os.ReadFile(filepath.Join(dir, daemon.PublicKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	if err := conformance.Verify(pub, got.Report, got.Signature); err != nil {
		t.Errorf("signature does not verify: %v", err)
	}
	rep, err := conformance.Parse(got.Report)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.Simulated || rep.Profile != "a100-80gb-4x" || rep.Node.Region != "eu-central-1" || len(rep.GPUs) != 4 {
		t.Errorf("report %+v", rep)
	}
	tampered := bytes.Replace(got.Report, []byte(`"simulated":true`), []byte(`"simulated":false`), 1)
	if err := conformance.Verify(pub, tampered, got.Signature); err == nil {
		t.Error("a report claiming real hardware verified with the simulated report's signature")
	}
}

func TestDaemonFlagErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"no broker", []string{"--broker-token", "x", "--region", "r"}, nil, "--broker-url is required"},
		{"no token", []string{"--broker-url", "http://127.0.0.1:1", "--region", "r"}, nil, "--broker-token is required"},
		{"no region", []string{"--broker-url", "http://127.0.0.1:1", "--broker-token", "x"}, nil, "--region is required"},
		// The old name still sets the token: the next missing flag is named.
		{"old token flag", []string{"--broker-url", "http://127.0.0.1:1", "--token", "x"}, nil, "--region is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var out, errw bytes.Buffer
			code := Main(context.Background(), append(tt.args, "--state-dir", t.TempDir()), &out, &errw)
			if code != ExitUsage || !strings.Contains(errw.String(), tt.want) {
				t.Errorf("exit %d stderr %q, want %d and %q", code, errw.String(), ExitUsage, tt.want)
			}
		})
	}
}

func TestApplyEnvTokenFile(t *testing.T) {
	t.Parallel()
	tokFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokFile, []byte("gpa_secret_value\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := NewCommand(io.Discard)
	env := map[string]string{"GPUPASS_BROKER_TOKEN_FILE": tokFile, "GPUPASS_REGION": "eu-west-1", "GPUPASS_PRICE_PER_HOUR": "nope"}
	err := applyEnv(cmd, func(k string) string { return env[k] })
	if err == nil || !strings.Contains(err.Error(), "GPUPASS_PRICE_PER_HOUR") {
		t.Errorf("bad number accepted: %v", err)
	}
	delete(env, "GPUPASS_PRICE_PER_HOUR")
	cmd = NewCommand(io.Discard)
	if err := applyEnv(cmd, func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if v, _ := cmd.Flags().GetString("broker-token"); v != "gpa_secret_value" {
		t.Errorf("token from file = %q", v)
	}
	// Units written for the old name (GPUPASS_TOKEN_FILE) keep working.
	oldCmd := NewCommand(io.Discard)
	old := map[string]string{"GPUPASS_TOKEN_FILE": tokFile}
	if err := applyEnv(oldCmd, func(k string) string { return old[k] }); err != nil {
		t.Fatal(err)
	}
	if v, _ := oldCmd.Flags().GetString("broker-token"); v != "gpa_secret_value" {
		t.Errorf("token from the old GPUPASS_TOKEN_FILE = %q", v)
	}
	if v, _ := cmd.Flags().GetString("region"); v != "eu-west-1" {
		t.Errorf("region = %q", v)
	}
}
