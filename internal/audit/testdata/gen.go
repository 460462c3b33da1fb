//go:build ignore

// gen writes the audit test fixtures: a cosign key pair (password
// "gpupass-test"), an agent identity key, and run.json, a finished run
// record whose conformance report that agent key signed. Run it from the
// repository root: go run ./internal/audit/testdata/gen.go
package main

import (
	"encoding/json"
	"log"
	"os"
	"path/filepath"
	"time"

	"github.com/gpupass/gpupass/internal/audit"
	"github.com/gpupass/gpupass/internal/conformance"
	"github.com/gpupass/gpupass/internal/spec"
)

const dir = "internal/audit/testdata"

func main() {
	priv, pub, err := audit.GenerateKeyPair([]byte("gpupass-test"))
	check(err)
	check(os.WriteFile(filepath.Join(dir, "cosign.key"), priv, 0o600))
	check(os.WriteFile(filepath.Join(dir, "cosign.pub"), pub, 0o644))

	agentPath := filepath.Join(dir, "agent.key")
	os.Remove(agentPath)
	agent, err := conformance.LoadOrCreateKey(agentPath)
	check(err)
	agentPub, err := conformance.PublicKeyPEM(agent)
	check(err)
	check(os.WriteFile(filepath.Join(dir, "agent.pub"), agentPub, 0o644))

	declared := spec.Spec{Name: "llm-finetune", Runtime: spec.Runtime{CUDA: "12.1", NvidiaDriver: "535.104.05", Python: "3.11", PyTorch: "2.1.0", Packages: []string{"numpy==1.26.2"}},
		Security: spec.Security{NoInternetAccess: true}, Resources: spec.Resources{Accelerator: "h100-sxm5", Count: 2}}
	// The run's own report: bound to the allocation, measured against
	// the declared spec, and matching it.
	fp, err := spec.Fingerprint(&declared)
	check(err)
	rep := conformance.Report{
		SchemaVersion:   conformance.SchemaVersion,
		AgentID:         "agent-sim-0",
		GeneratedAt:     "2026-11-29T10:00:00.000Z",
		Simulated:       true,
		Profile:         "h100-sxm5-8x",
		AllocationID:    "alloc-7f3a",
		SpecFingerprint: fp,
		Node:            conformance.Node{Provider: "sim", Region: "us-west-2", Zone: "us-west-2a", Hostname: "sim-node-0"},
		Runtime: conformance.Runtime{
			NvidiaDriver: "535.104.05", CUDADriverAPI: "12.2", CUDA: "12.1.105", Python: "3.11.6",
			PyTorch: "2.1.0+cu121", TorchCUDA: "12.1", Packages: map[string]string{"numpy": "1.26.2", "torch": "2.1.0"},
		},
		RuntimeFingerprint: fp,
		GPUs: []conformance.GPU{
			{Index: 0, Name: "NVIDIA H100 80GB HBM3", Class: "h100-sxm5", UUID: "GPU-00000000-0000-0000-0000-000000000000", Serial: "1650123456780", VBIOS: "96.00.74.00.01", MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, PCIeGen: 5, PCIeWidth: 16, NVLinkActive: 18},
			{Index: 1, Name: "NVIDIA H100 80GB HBM3", Class: "h100-sxm5", UUID: "GPU-00000000-0000-0000-0000-000000000001", Serial: "1650123456781", VBIOS: "96.00.74.00.01", MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, PCIeGen: 5, PCIeWidth: 16, NVLinkActive: 18},
		},
		Storage: conformance.Storage{Path: "/scratch", FSType: "ext4", FreeGB: 900, ReadMBps: 2500, Class: "high-iops-nvme"},
		Checks: []conformance.Check{
			{Name: "driver.version", Expected: "535.104.05", Actual: "535.104.05", Status: conformance.Pass, DurationMS: 1.2},
			{Name: "cuda.toolkit", Expected: "12.1", Actual: "12.1.105", Status: conformance.Pass, DurationMS: 35.5},
			{Name: "torch.abi", Expected: "2.1.0", Actual: "2.1.0+cu121", Status: conformance.Pass, DurationMS: 812.25},
			{Name: "gpu.count", Expected: "2", Actual: "2", Status: conformance.Pass, DurationMS: 0.4},
			{Name: "storage.read_mbps", Expected: ">= 2000", Actual: "2500", Status: conformance.Warn, DurationMS: 1500, Message: "measured on a simulated disk"},
		},
		Notes:           []string{"NVML not available: simulated profile h100-sxm5-8x"},
		SuiteDurationMS: 2349.35,
	}
	repBytes, err := rep.Marshal()
	check(err)
	sig, err := conformance.Sign(agent, repBytes)
	check(err)

	specYAML := "name: llm-finetune\nruntime:\n  cuda: \"12.1\"\n  nvidia-driver: \"535.104.05\"\n  python: \"3.11\"\n  pytorch: \"2.1.0\"\n  packages: [\"numpy==1.26.2\"]\nsecurity:\n  fips-compliant: false\n  no-internet-access: true\nresources:\n  accelerator: h100-sxm5\n  count: 2\n"
	start := time.Date(2026, 11, 29, 10, 0, 5, 0, time.UTC)
	r := audit.Run{
		AllocationID: "alloc-7f3a", State: "succeeded", Result: "succeeded",
		StartedAt: start, FinishedAt: start.Add(47*time.Minute + 12*time.Second), Restarts: 1,
		BundleDigest: "sha256:0d2f1e3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69788796a5b4c3d2e1f0",
		SpecFile:     "gpupass.yaml", SpecBytes: specYAML,
		Spec: declared, DeclaredFingerprint: fp,
		Conformance: audit.Evidence{Report: repBytes, Signature: sig, AgentPublicKeyPEM: string(agentPub)},
		Simulated:   true,
	}
	for i := range 20 {
		r.Metrics = append(r.Metrics,
			audit.MetricPoint{Name: "loss", Step: int64(i * 100), Value: 2.5 - float64(i)*0.1, Time: start.Add(time.Duration(i) * time.Minute)},
			audit.MetricPoint{Name: "tokens_per_s", Step: int64(i * 100), Value: 41000 + float64(i%3)*250, Time: start.Add(time.Duration(i) * time.Minute)})
	}
	b, err := json.MarshalIndent(r, "", "  ")
	check(err)
	check(os.WriteFile(filepath.Join(dir, "run.json"), append(b, '\n'), 0o644))
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
