package probe

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/testutil"
)

func TestParseNVCCVersion(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file, want string
		wantErr    bool
	}{
		{"nvcc-12.1.txt", "12.1.105", false},
		{"nvcc-11.8.txt", "11.8.89", false},
		{"nvcc-garbage.txt", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			b, err := os.ReadFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			got, err := ParseNVCCVersion(b)
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("ParseNVCCVersion = %q, %v; want %q, err=%v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// fakeTool writes an executable that prints a testdata file, so the
// probe's exec path and its parsing run for real.
func fakeTool(t *testing.T, name, testdataFile string) string {
	t.Helper()
	data, err := filepath.Abs(filepath.Join("testdata", testdataFile))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte("#!/bin/sh\nexec cat '"+data+"'\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestNVCCProbe(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tool := fakeTool(t, "nvcc", "nvcc-12.1.txt")
	sec, err := NVCC{Path: tool}.Measure(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(NVCCSection{Found: true, Path: tool, Version: "12.1.105"}, sec); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	missing := filepath.Join(t.TempDir(), "nvcc")
	sec, _ = NVCC{Path: missing}.Measure(ctx)
	if s := sec.(NVCCSection); s.Found || s.Reason != "not found: "+missing {
		t.Errorf("absent nvcc: %+v, want not found", s)
	}
	garbage := fakeTool(t, "nvcc", "nvcc-garbage.txt")
	sec, _ = NVCC{Path: garbage}.Measure(ctx)
	if s := sec.(NVCCSection); s.Found || !strings.Contains(s.Reason, "no \"release") {
		t.Errorf("garbage nvcc: %+v", s)
	}
	k1, ok1 := NVCC{Path: tool}.StateKey(ctx, nil)
	if err := os.WriteFile(tool, []byte("#!/bin/sh\necho changed release 12.4, V12.4.131\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	k2, ok2 := NVCC{Path: tool}.StateKey(ctx, nil)
	if !ok1 || !ok2 || k1 == k2 {
		t.Errorf("state key did not change when nvcc was replaced: %q %q", k1, k2)
	}
}

func TestFIPS(t *testing.T) {
	t.Parallel()
	tests := []struct {
		file string
		want FIPSSection
	}{
		{"fips-on", FIPSSection{Found: true, Enabled: true}},
		{"fips-off", FIPSSection{Found: true}},
		{"fips-absent", FIPSSection{Reason: "not found: testdata/fips-absent"}},
		{"fips-junk", FIPSSection{Reason: `testdata/fips-junk: unexpected content "x"`}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			got, err := FIPS{Path: "testdata/" + tt.file}.Measure(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestFindMount(t *testing.T) {
	t.Parallel()
	tests := []struct {
		path string
		want Mount
	}{
		{"/home/user", Mount{"/", "/dev/vda1", "ext4", []string{"rw", "relatime", "errors=remount-ro"}}},
		// /data is mounted twice; the later NFS mount hides the XFS one.
		{"/data/models", Mount{"/data", "10.0.0.5:/vol", "nfs4", []string{"rw", "noatime", "nodiratime", "vers=4.2", "rsize=1048576"}}},
		{"/data/scratch/x", Mount{"/data/scratch", "/dev/nvme1n1", "ext4", []string{"rw", "relatime", "stripe=32"}}},
		{"/data/scratchy", Mount{"/data", "10.0.0.5:/vol", "nfs4", []string{"rw", "noatime", "nodiratime", "vers=4.2", "rsize=1048576"}}},
		{"/mnt/my disk/a", Mount{"/mnt/my disk", "host:/export", "fuse.sshfs", []string{"rw", "nodev", "noatime", "user_id=0"}}},
	}
	for _, tt := range tests {
		t.Run(tt.path, func(t *testing.T) {
			t.Parallel()
			got, err := FindMount("testdata/mountinfo", tt.path)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := FindMount("testdata/mountinfo-bad", "/x"); err == nil || !strings.Contains(err.Error(), "testdata/mountinfo-bad:1: malformed") {
		t.Errorf("bad mountinfo: err = %v, want file:line malformed", err)
	}
}

func TestStorageReal(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	sec, err := Storage{Path: dir}.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := sec.(StorageSection)
	if s.Reason != "" || s.FSType == "" || s.MountPoint == "" || s.TotalBytes == 0 || s.FreeBytes > s.TotalBytes {
		t.Errorf("storage of %s: %+v", dir, s)
	}
	out, err := exec.Command("findmnt", "-n", "-o", "FSTYPE", "-T", dir).Output()
	if err == nil && strings.TrimSpace(string(out)) != s.FSType {
		t.Errorf("fs type %q, findmnt says %q", s.FSType, strings.TrimSpace(string(out)))
	}
	sec, _ = Storage{Path: filepath.Join(dir, "absent")}.Measure(context.Background())
	if s := sec.(StorageSection); !strings.Contains(s.Reason, "absent") {
		t.Errorf("absent path: %+v", s)
	}
}

func TestReadThroughput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	p := ReadThroughput{Path: dir, Bytes: 4 << 20}
	sec, err := p.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	r := sec.(ReadSection)
	if r.Reason != "" || r.MBps <= 0 || r.Bytes != 4<<20 {
		t.Errorf("read probe: %+v", r)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, ".gpupass-readprobe-*")); len(left) != 0 {
		t.Errorf("read probe left %v behind", left)
	}
	if _, ok := p.StateKey(context.Background(), r); !ok {
		t.Error("fresh measurement on an unchanged mount not reusable")
	}
	r.MeasuredAt = r.MeasuredAt.Add(-2 * 60 * 60 * 1e9)
	if _, ok := p.StateKey(context.Background(), r); ok {
		t.Error("two-hour-old measurement reused")
	}
	sec, _ = ReadThroughput{Path: filepath.Join(dir, "absent"), Bytes: 1 << 20}.Measure(context.Background())
	if r := sec.(ReadSection); r.Reason == "" {
		t.Errorf("read probe on absent dir: %+v", r)
	}
}

// TestPythonReal probes the interpreter that has torch here
// (/usr/bin/python3, Debian's python3-torch).
func TestPythonReal(t *testing.T) {
	t.Parallel()
	py := "/usr/bin/python3"
	if _, err := os.Stat(py); err != nil {
		testutil.Missing(t, "%s", py)
	}
	if err := exec.Command(py, "-c", "import torch").Run(); err != nil {
		testutil.Missing(t, "torch in %s (apt python3-torch)", py)
	}
	want := func(code string) string {
		out, err := exec.Command(py, "-c", code).Output()
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(out))
	}
	p := Python{Exe: py, Packages: []string{"NumPy", "surely_not_installed_pkg"}}
	sec, err := p.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s := sec.(PythonSection)
	if !s.Found {
		t.Fatalf("python not found: %+v", s)
	}
	if w := want("import sys; print('%d.%d.%d' % sys.version_info[:3])"); s.Version != w {
		t.Errorf("version %q, want %q", s.Version, w)
	}
	if w := want("import torch; print(torch.__version__)"); s.Torch != w {
		t.Errorf("torch %q, want %q", s.Torch, w)
	}
	if w := want("import importlib.metadata as m; print(m.version('numpy'))"); s.Packages["numpy"] != w {
		t.Errorf("numpy %q, want %q", s.Packages["numpy"], w)
	}
	if v, ok := s.Packages["surely-not-installed-pkg"]; !ok || v != "" {
		t.Errorf("absent package: %q %v, want present with empty version", v, ok)
	}
	if !strings.Contains(s.TorchConfig, "PyTorch") {
		t.Errorf("torch config %q lacks PyTorch build settings", s.TorchConfig)
	}
	if _, ok := p.StateKey(context.Background(), s); !ok {
		t.Error("no state key for a found interpreter")
	}
}

func TestPythonAbsentAndNoTorch(t *testing.T) {
	t.Parallel()
	sec, err := Python{Exe: filepath.Join(t.TempDir(), "python3")}.Measure(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if s := sec.(PythonSection); s.Found || !strings.HasPrefix(s.Reason, "not found: ") {
		t.Errorf("absent python: %+v", s)
	}
	// A python3 without torch: the first python3 on PATH here, or skip.
	py, err := exec.LookPath("python3")
	if err != nil || exec.Command(py, "-c", "import torch").Run() == nil {
		t.Skip("no python3 without torch to test with")
	}
	sec, _ = Python{Exe: py}.Measure(context.Background())
	s := sec.(PythonSection)
	if !s.Found || s.Torch != "" || !strings.HasPrefix(s.TorchReason, "not found") {
		t.Errorf("python without torch: found=%v torch=%q reason=%q", s.Found, s.Torch, s.TorchReason)
	}
}

func TestParsePythonOutputNoise(t *testing.T) {
	t.Parallel()
	out := []byte("warning: something\nGPUPASS_PROBE not this\n\nGPUPASS_PROBE {\"version\":\"3.10.12\",\"torch\":\"2.1.0+cu121\",\"torch_cuda\":\"12.1\",\"cudnn\":8902,\"packages\":{\"a\":\"1\"}}\n")
	sec, err := parsePythonOutput("py", out)
	if err != nil {
		t.Fatal(err)
	}
	want := PythonSection{Found: true, Executable: "py", Version: "3.10.12", Torch: "2.1.0+cu121", TorchCUDA: "12.1", CuDNN: "8.9.2", Packages: map[string]string{"a": "1"}}
	if diff := cmp.Diff(want, sec); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	sec, _ = parsePythonOutput("py", []byte("just noise"))
	if s := sec.(PythonSection); s.Found || s.Reason == "" {
		t.Errorf("noise: %+v", s)
	}
}

func TestCuDNNVersion(t *testing.T) {
	t.Parallel()
	for in, want := range map[int]string{8902: "8.9.2", 8600: "8.6.0", 90100: "9.1.0", 90300: "9.3.0", 7605: "7.6.5"} {
		if got := CuDNNVersion(in); got != want {
			t.Errorf("CuDNNVersion(%d) = %q, want %q", in, got, want)
		}
	}
}

func TestNormalizePackage(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"Flash_Attn": "flash-attn", "zope.interface": "zope-interface", "a--b__c": "a-b-c", "NumPy": "numpy"} {
		if got := NormalizePackage(in); got != want {
			t.Errorf("NormalizePackage(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestClassOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mem  uint64
		want string
	}{
		{"NVIDIA H100 80GB HBM3", 81559, "h100-sxm5"},
		{"NVIDIA H100 PCIe", 81559, "h100-pcie"},
		{"NVIDIA H200 141GB HBM3e", 144384, "h200"},
		{"NVIDIA A100-SXM4-80GB", 81920, "a100-80gb"},
		{"NVIDIA A100-SXM4-40GB", 40960, "a100-40gb"},
		{"NVIDIA GeForce RTX 4090", 24564, "rtx-4090"},
		{"NVIDIA L40S", 46068, "l40s"},
		{"Tesla T4", 15360, ""},
	}
	for _, tt := range tests {
		if got := ClassOf(tt.name, tt.mem); got != tt.want {
			t.Errorf("ClassOf(%q) = %q, want %q", tt.name, got, tt.want)
		}
	}
}

// TestPythonReturnsWhenAChildHoldsItsOutput: an interpreter that leaves a
// process running with its stdout (a daemon a .pth file spawned) is
// stopped with the probe's context, and the probe returns soon after
// instead of waiting for that process to close the pipe.
func TestPythonReturnsWhenAChildHoldsItsOutput(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	pidFile := filepath.Join(dir, "child.pid")
	exe := filepath.Join(dir, "python3")
	script := "#!/bin/sh\nsleep 30 &\necho $! > " + pidFile + "\nsleep 30\n"
	if err := os.WriteFile(exe, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if b, err := os.ReadFile(pidFile); err == nil {
			if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := Python{Exe: exe}.Measure(ctx)
	if d := time.Since(start); d > 15*time.Second {
		t.Fatalf("probe returned after %v: it waited for the child holding its output", d)
	}
	if err == nil {
		t.Error("a probe stopped by its context reported no error")
	}
}
