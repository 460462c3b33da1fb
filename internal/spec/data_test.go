package spec

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestDataTables checks the embedded tables are well formed and cover
// what the issue asks: torch 1.13 to 2.5 at least.
func TestDataTables(t *testing.T) {
	t.Parallel()
	tb, err := loadTables()
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"1.13.0", "1.13.1", "2.0.1", "2.1.2", "2.2.2", "2.3.1", "2.4.1", "2.5.1"} {
		if _, ok := tb.torchRelease(mustVersion(want)); !ok {
			t.Errorf("torch table lacks %s", want)
		}
	}
	for _, r := range tb.torch {
		if len(r.CUDA) == 0 || len(r.Python) == 0 {
			t.Errorf("torch %s: empty cuda or python list", r.Version)
		}
		for _, tag := range r.CUDA {
			if !isCUDATag(tag) {
				t.Errorf("torch %s: bad tag %q", r.Version, tag)
			}
		}
	}
	for mm, c := range tb.cuda {
		if _, ok := driverVersion(c.MinDriver); !ok {
			t.Errorf("cuda %s: bad min_driver %q", mm, c.MinDriver)
		}
		if c.NVCC != "" && !strings.HasPrefix(c.NVCC, mm+".") {
			t.Errorf("cuda %s: nvcc example %q is another release", mm, c.NVCC)
		}
	}
	seen := map[string]bool{}
	for _, a := range tb.accelerators {
		if seen[a.Name] {
			t.Errorf("accelerator %s listed twice", a.Name)
		}
		seen[a.Name] = true
		mustVersion(a.MinCUDA)
	}
	for _, want := range []string{"a100-40gb", "a100-80gb", "h100-pcie", "h100-sxm5", "h200", "l40s", "rtx-4090"} {
		if !seen[want] {
			t.Errorf("accelerator list lacks %s", want)
		}
	}
	for name, p := range tb.compiled {
		if !slices.Contains([]string{"prebuilt", "source", "jit"}, p.Build) {
			t.Errorf("%s: build %q", name, p.Build)
		}
		for _, r := range p.Ranges {
			for _, v := range []string{r.From, r.Before, r.MinCUDA, r.MaxCUDA} {
				if v != "" {
					if _, err := ParseVersion(v); err != nil {
						t.Errorf("%s: %v", name, err)
					}
				}
			}
		}
	}
}

// TestTorchMatrix: every published (torch, cuXXX, python) combination of
// the table, with a matching toolkit and driver, passes the torch and
// python rules; the same torch with an unpublished tag does not.
func TestTorchMatrix(t *testing.T) {
	t.Parallel()
	for _, r := range tbl().torch {
		for _, tag := range r.CUDA {
			digits := strings.TrimPrefix(tag, "cu")
			cuda := digits[:len(digits)-1] + "." + digits[len(digits)-1:] + ".0"
			for _, py := range r.Python {
				spec := fmt.Sprintf("name: m\nruntime:\n  cuda: %s\n  nvidia-driver: 999.99.99\n  python: %s.1\n  pytorch: %s+%s\n", cuda, py, r.Version, tag)
				for _, f := range Validate("m.yaml", []byte(spec)).Findings {
					if strings.HasPrefix(f.Rule, "torch.") || strings.HasPrefix(f.Rule, "python.") {
						t.Errorf("torch %s+%s python %s: %s: %s", r.Version, tag, py, f.Rule, f.Message)
					}
				}
			}
		}
		spec := fmt.Sprintf("name: m\nruntime:\n  cuda: 10.2.89\n  nvidia-driver: 999.99.99\n  python: %s.1\n  pytorch: %s+cu102\n", r.Python[0], r.Version)
		if !slices.Contains(rulesOf(Validate("m.yaml", []byte(spec)).Findings), "torch.unpublished") {
			t.Errorf("torch %s+cu102 should be unpublished", r.Version)
		}
	}
}

func TestFlashAttnCUDAFloor(t *testing.T) {
	t.Parallel()
	// flash-attn's setup.py refuses older nvcc: 11.4 through v2.1, 11.6
	// from v2.2, 11.7 by v2.7.4.
	tests := []struct {
		fa, cuda, torch string
		want            bool // package.cuda-unsupported expected
	}{
		{"2.1.0", "11.4.4", "", false},
		{"2.2.0", "11.4.4", "", true},
		{"2.5.5", "11.6.124", "", false},
		{"2.7.4.post1", "11.6.124", "", true},
		{"2.7.4.post1", "12.4.131", "", false},
	}
	for _, tt := range tests {
		spec := fmt.Sprintf("name: m\nruntime:\n  cuda: %s\n  nvidia-driver: 999.1.1\n  python: 3.10.1\n  pytorch: 2.1.0+cu121\n  packages: [flash-attn==%s]\n", tt.cuda, tt.fa)
		got := slices.Contains(rulesOf(Validate("m.yaml", []byte(spec)).Findings), "package.cuda-unsupported")
		if got != tt.want {
			t.Errorf("flash-attn %s on CUDA %s: cuda-unsupported = %v, want %v", tt.fa, tt.cuda, got, tt.want)
		}
	}
}

func TestBitsandbytesCUDARange(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		bnb, cuda, torch string
		want             bool
	}{
		{"0.43.0", "12.4.131", "2.4.1+cu124", true},
		{"0.43.1", "12.4.131", "2.4.1+cu124", false},
		{"0.43.3", "12.6.85", "2.6.0+cu126", true},
		{"0.45.0", "12.6.85", "2.6.0+cu126", false},
	} {
		spec := fmt.Sprintf("name: m\nruntime:\n  cuda: %s\n  nvidia-driver: 999.1.1\n  python: 3.10.1\n  pytorch: %s\n  packages: [bitsandbytes==%s]\n", tt.cuda, tt.torch, tt.bnb)
		res := Validate("m.yaml", []byte(spec))
		got := slices.Contains(rulesOf(res.Findings), "package.cuda-unsupported")
		if got != tt.want {
			t.Errorf("bitsandbytes %s on CUDA %s: cuda-unsupported = %v, want %v (%+v)", tt.bnb, tt.cuda, got, tt.want, res.Findings)
		}
	}
}
