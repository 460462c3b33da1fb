package spec

import (
	"embed"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
)

// The data tables ship inside the binary; each file names its source.
//
//go:embed data/*.json
var dataFS embed.FS

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

// tbl returns the tables, decoded on first use so that commands which
// never validate a spec do not pay for it at start-up.
var tbl = sync.OnceValue(mustLoadTables)

func mustLoadTables() *tables {
	t, err := loadTables()
	if err != nil {
		// The files are embedded and tested; a failure here is a build bug.
		panic(fmt.Sprintf("spec: embedded data: %v", err))
	}
	return t
}

func loadTables() (*tables, error) {
	read := func(name string, v any) error {
		b, err := dataFS.ReadFile("data/" + name)
		if err != nil {
			return err
		}
		if err := json.Unmarshal(b, v); err != nil {
			return fmt.Errorf("decoding %s: %w", name, err)
		}
		return nil
	}
	var torch struct{ Releases []torchRelease }
	var cuda struct{ Toolkits []cudaToolkit }
	var acc struct{ Classes []accelerator }
	var comp struct{ Packages []compiledPackage }
	for name, v := range map[string]any{"torch.json": &torch, "cuda.json": &cuda, "accelerators.json": &acc, "compiled.json": &comp} {
		if err := read(name, v); err != nil {
			return nil, err
		}
	}
	t := &tables{cuda: map[string]cudaToolkit{}, compiled: map[string]compiledPackage{}, accelerators: acc.Classes}
	for _, r := range torch.Releases {
		v, err := ParseVersion(r.Version)
		if err != nil {
			return nil, fmt.Errorf("torch.json: %w", err)
		}
		r.v = v
		t.torch = append(t.torch, r)
	}
	for _, c := range cuda.Toolkits {
		t.cuda[c.CUDA] = c
		t.cudaOrder = append(t.cudaOrder, c.CUDA)
	}
	for _, p := range comp.Packages {
		t.compiled[NormalizeName(p.Name)] = p
	}
	return t, nil
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
