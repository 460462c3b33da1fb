package bundle_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/wheel"
)

func TestCheckCoverage(t *testing.T) {
	t.Parallel()
	w := func(file string) bundle.Wheel {
		f, err := wheel.ParseFilename(file)
		if err != nil {
			t.Fatal(err)
		}
		var tags []string
		for _, tg := range f.Tags {
			tags = append(tags, tg.String())
		}
		return bundle.Wheel{File: file, Name: f.Name(), Version: f.Version, Tags: tags}
	}
	house := []bundle.Wheel{
		w("transformers-4.38.2-py3-none-any.whl"),
		w("flash_attn-2.5.5-cp310-cp310-linux_x86_64.whl"),
		w("numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
		w("tokenizers-0.15.2-cp310-cp310-manylinux_2_39_x86_64.whl"),
		w("safetensors-0.4.2-cp37-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"),
		w("Pillow-10.2.0-cp310-cp310-manylinux_2_28_x86_64.whl"),
	}
	tests := []struct {
		name         string
		pins         []string
		python       string
		covered      []string
		missing      []string
		incompatible []string
	}{
		{
			name:    "all covered",
			pins:    []string{"transformers==4.38.2", "flash-attn==2.5.5", "safetensors==0.4.2", "pillow==10.2"},
			python:  "3.10.12",
			covered: []string{"transformers-4.38.2-py3-none-any.whl", "flash_attn-2.5.5-cp310-cp310-linux_x86_64.whl", "safetensors-0.4.2-cp37-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", "Pillow-10.2.0-cp310-cp310-manylinux_2_28_x86_64.whl"},
		},
		{
			name:         "wrong interpreter, too new glibc, wrong version, absent",
			pins:         []string{"numpy==1.26.4", "tokenizers==0.15.2", "transformers==4.38.1", "torchvision==0.16.0"},
			python:       "3.10",
			missing:      []string{"transformers==4.38.1", "torchvision==0.16.0"},
			incompatible: []string{"numpy==1.26.4", "tokenizers==0.15.2"},
		},
		{
			name:         "another python",
			pins:         []string{"numpy==1.26.4", "flash-attn==2.5.5"},
			python:       "3.11.8",
			covered:      []string{"numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"},
			incompatible: []string{"flash-attn==2.5.5"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pins, err := bundle.ParsePins(tt.pins)
			if err != nil {
				t.Fatal(err)
			}
			c, err := bundle.CheckCoverage(pins, wheel.DefaultTarget(tt.python), house)
			if err != nil {
				t.Fatal(err)
			}
			var covered, missing, incompatible []string
			for _, p := range c.Covered {
				covered = append(covered, p.File)
			}
			for _, p := range c.Missing {
				missing = append(missing, p.Raw)
			}
			for _, p := range c.Incompatible {
				incompatible = append(incompatible, p.Pin.Raw)
			}
			if diff := cmp.Diff([][]string{tt.covered, tt.missing, tt.incompatible}, [][]string{covered, missing, incompatible}); diff != "" {
				t.Errorf("covered/missing/incompatible (-want +got):\n%s", diff)
			}
			if c.Complete() != (len(tt.missing)+len(tt.incompatible) == 0) {
				t.Errorf("Complete() = %v", c.Complete())
			}
			if len(c.Problems()) != len(tt.missing)+len(tt.incompatible) {
				t.Errorf("Problems() = %v", c.Problems())
			}
		})
	}
}

func TestParsePins(t *testing.T) {
	t.Parallel()
	for _, bad := range []string{"transformers", "transformers>=4.0", "flash-attn==2.*", "x==1.0; python_version<'3'", ""} {
		if _, err := bundle.ParsePins([]string{bad}); err == nil || !strings.Contains(err.Error(), "runtime.packages[0]") {
			t.Errorf("ParsePins(%q) error = %v, want one naming runtime.packages[0]", bad, err)
		}
	}
	pins, err := bundle.ParsePins([]string{"Flash_Attn[triton]==2.5.5", "torch == 2.1.0+cu121"})
	if err != nil {
		t.Fatal(err)
	}
	want := []bundle.Pin{{Name: "flash-attn", Version: "2.5.5", Raw: "Flash_Attn[triton]==2.5.5"}, {Name: "torch", Version: "2.1.0+cu121", Raw: "torch == 2.1.0+cu121"}}
	if diff := cmp.Diff(want, pins); diff != "" {
		t.Errorf("pins (-want +got):\n%s", diff)
	}
}
