package probe

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestBuiltinProfiles(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		class     string
		gpuName   string
		count     int
		memMiB    uint64
		pcie      [2]int
		nvlink    int
		wantNVCC  string
		wantTorch string
	}{
		{"h100-sxm5-8x", "h100-sxm5", "NVIDIA H100 80GB HBM3", 8, 81559, [2]int{5, 16}, 18, "12.1.105", "2.1.0+cu121"},
		{"a100-80gb-4x", "a100-80gb", "NVIDIA A100-SXM4-80GB", 4, 81920, [2]int{4, 16}, 12, "12.1.105", "2.1.0+cu121"},
		{"rtx-4090-1x", "rtx-4090", "NVIDIA GeForce RTX 4090", 1, 24564, [2]int{4, 16}, 0, "12.4.131", "2.4.0+cu124"},
	}
	if diff := cmp.Diff([]string{"a100-80gb-4x", "h100-sxm5-8x", "rtx-4090-1x"}, ProfileNames()); diff != "" {
		t.Errorf("ProfileNames (-want +got):\n%s", diff)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p, err := LoadProfile(tt.name)
			if err != nil {
				t.Fatal(err)
			}
			ctx := context.Background()
			sec, err := p.WithSeed("node-a").GPUProbe().Measure(ctx)
			if err != nil {
				t.Fatal(err)
			}
			g := sec.(GPUSection)
			if !g.Available || !g.Simulated || g.Profile != tt.name || g.Class != tt.class || len(g.GPUs) != tt.count {
				t.Fatalf("GPU section %+v", g)
			}
			if ClassOf(g.GPUs[0].Name, g.GPUs[0].MemoryTotalMiB) != tt.class {
				t.Errorf("profile name %q does not classify as %s", g.GPUs[0].Name, tt.class)
			}
			uuids := map[string]bool{}
			for _, d := range g.GPUs {
				if d.Name != tt.gpuName || d.MemoryTotalMiB != tt.memMiB || d.PCIeGen != tt.pcie[0] || d.PCIeWidth != tt.pcie[1] || d.NVLinkActive != tt.nvlink {
					t.Errorf("GPU %d = %+v", d.Index, d)
				}
				uuids[d.UUID] = true
			}
			if len(uuids) != tt.count {
				t.Errorf("UUIDs not unique: %v", uuids)
			}
			other, _ := p.WithSeed("node-b").GPUProbe().Measure(ctx)
			again, _ := p.WithSeed("node-a").GPUProbe().Measure(ctx)
			if other.(GPUSection).GPUs[0].UUID == g.GPUs[0].UUID {
				t.Error("two nodes with one profile share GPU UUIDs")
			}
			if again.(GPUSection).GPUs[0].UUID != g.GPUs[0].UUID {
				t.Error("the same node got new GPU UUIDs")
			}
			n, _ := p.NVCCProbe().Measure(ctx)
			if s := n.(NVCCSection); !s.Simulated || s.Version != tt.wantNVCC {
				t.Errorf("nvcc %+v", s)
			}
			py, _ := p.PythonProbe([]string{"Transformers", "nothere"}).Measure(ctx)
			ps := py.(PythonSection)
			if !ps.Simulated || ps.Torch != tt.wantTorch || ps.Packages["nothere"] != "" || ps.Packages["transformers"] == "" {
				t.Errorf("python %+v", ps)
			}
			var f Facts
			f.Apply(sec)
			if !f.Simulated() {
				t.Error("facts from a profile not simulated")
			}
		})
	}
}

func TestBadProfiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	tests := []struct {
		name, body, want string
	}{
		{"unknown-field.json", `{"name":"x","colour":"red"}`, `unknown field "colour"`},
		{"not-json.json", `not json`, "invalid character"},
		{"missing.json", `{"name":"x","driver_version":"535.104.05","cuda_driver_api":"12.2","gpu":{"name":"NVIDIA H100 80GB HBM3","count":0,"memory_total_mib":0}}`, "field gpu.count must be between 1 and 64"},
		{"used.json", `{"name":"x","driver_version":"535.104.05","cuda_driver_api":"12.2","gpu":{"name":"G","count":1,"memory_total_mib":10,"memory_used_mib":11}}`, "field gpu.memory_used_mib must not exceed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			p := filepath.Join(dir, tt.name)
			if err := os.WriteFile(p, []byte(tt.body), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := LoadProfile(p)
			if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), p) {
				t.Errorf("err = %v, want one naming %s and %q", err, p, tt.want)
			}
		})
	}
	if _, err := LoadProfile("h200-nope"); err == nil || !strings.Contains(err.Error(), "h100-sxm5-8x") {
		t.Errorf("unknown name: err = %v, want the list of profiles", err)
	}
}
