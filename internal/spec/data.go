package spec

import (
	"slices"
	"sync"
)

// The data tables are data/*.json, each file naming its source. The
// binary carries them as Go values (tables_gen.go, regenerated with go
// generate and held to the JSON by TestTablesGenerated): decoding the JSON
// at run time was a large part of what `gpupass validate` allocated.
//
//go:generate go test -run ^TestTablesGenerated$ -update .

type torchRelease struct {
	Version string   `json:"version"`
	CUDA    []string `json:"cuda"`
	Python  []string `json:"python"`
	v       Version
}

type cudaToolkit struct {
	CUDA      string `json:"cuda"`
	MinDriver string `json:"min_driver"`
	NVCC      string `json:"nvcc"`
}

type accelerator struct {
	Name    string `json:"name"`
	Arch    string `json:"arch"`
	MinCUDA string `json:"min_cuda"`
}

type compiledRange struct {
	From    string `json:"from"`
	Before  string `json:"before"`
	MinCUDA string `json:"min_cuda"`
	MaxCUDA string `json:"max_cuda"`
}

type compiledPackage struct {
	Name   string          `json:"name"`
	Build  string          `json:"build"` // prebuilt | source | jit
	Ranges []compiledRange `json:"ranges"`
}

// tables holds the parsed data files.
type tables struct {
	torch        []torchRelease
	cuda         map[string]cudaToolkit // by "major.minor"
	cudaOrder    []string
	accelerators []accelerator
	compiled     map[string]compiledPackage
}

// tbl returns the tables, indexed on first use so that commands which
// never validate a spec do not pay for it at start-up.
var tbl = sync.OnceValue(func() *tables { return newTables(genTorch, genCUDA, genAccelerators, genCompiled) })

// newTables indexes the tables. Each torch release's version is parsed
// already (the generator and loadTables do it).
func newTables(torch []torchRelease, cuda []cudaToolkit, acc []accelerator, comp []compiledPackage) *tables {
	t := &tables{torch: torch, cuda: make(map[string]cudaToolkit, len(cuda)), compiled: make(map[string]compiledPackage, len(comp)), accelerators: acc}
	for _, c := range cuda {
		t.cuda[c.CUDA] = c
		t.cudaOrder = append(t.cudaOrder, c.CUDA)
	}
	for _, p := range comp {
		t.compiled[NormalizeName(p.Name)] = p
	}
	return t
}

func (t *tables) torchRelease(v Version) (torchRelease, bool) {
	for _, r := range t.torch {
		if r.v.Compare(v) == 0 {
			return r, true
		}
	}
	return torchRelease{}, false
}

func (t *tables) accelerator(name string) (accelerator, bool) {
	i := slices.IndexFunc(t.accelerators, func(a accelerator) bool { return a.Name == name })
	if i < 0 {
		return accelerator{}, false
	}
	return t.accelerators[i], true
}

func (t *tables) acceleratorNames() []string {
	out := make([]string, len(t.accelerators))
	for i, a := range t.accelerators {
		out[i] = a.Name
	}
	return out
}
