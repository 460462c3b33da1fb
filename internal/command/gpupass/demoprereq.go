package gpupass

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// DemoAptPackages are the Debian packages that give /usr/bin/python3 what
// the demo's training job imports. `scripts/setup.sh demo` (run by
// `make demo`) installs the same list; keep the two in step.
var DemoAptPackages = []string{"python3", "python3-torch", "python3-numpy"}

// CheckDemoPython checks, before `up --demo` starts anything, that python
// can run the example job: torch importable and every `==` pin of the
// example spec's runtime.packages installed at that version. Without this
// the stack starts, certifies, and the agents' runtime-init check refuses
// the run in every region at once, long after the cause could have been
// named. The torch version is not compared with runtime.pytorch: the
// simulated profile declares that one; the agent checks only the pins.
// python is started as the agent starts it (probe.Python, isolated), so
// the answer is the one the agent will get.
func CheckDemoPython(ctx context.Context, python, exampleDir string) error {
	specPath := filepath.Join(exampleDir, "gpupass.yaml")
	data, err := os.ReadFile(specPath)
	if err != nil {
		return fmt.Errorf("reading the example spec: %w (run from the repository root, or pass --example DIR)", err)
	}
	type pin struct{ name, norm, version string }
	var pins []pin
	if doc, _ := spec.Parse(specPath, data); doc != nil {
		for _, p := range doc.Spec.Runtime.Packages {
			req, err := spec.ParseRequirement(p)
			if err != nil {
				continue // the demo's validate step reports it, with its position
			}
			if _, ok := req.Pinned(); ok {
				pins = append(pins, pin{req.Name, probe.NormalizePackage(req.Name), req.Specs[0].Version})
			}
		}
	}
	names := make([]string, len(pins))
	for i, p := range pins {
		names[i] = p.norm
	}
	sec, err := probe.Python{Exe: python, Packages: names, Isolated: true}.Measure(ctx)
	if err != nil {
		return fmt.Errorf("checking the demo's Python %s: %w", python, err)
	}
	ps, _ := sec.(probe.PythonSection)
	var missing []string
	if !ps.Found {
		missing = append(missing, "a Python that starts ("+ps.Reason+")")
	} else {
		if ps.Torch == "" {
			missing = append(missing, "torch ("+ps.TorchReason+")")
		}
		for _, p := range pins {
			got := ps.Packages[p.norm]
			if got == "" {
				missing = append(missing, fmt.Sprintf("%s==%s (not installed)", p.name, p.version))
				continue
			}
			if ok, err := spec.PinMatches(p.version, got); err != nil {
				missing = append(missing, fmt.Sprintf("%s==%s (installed %s: %v)", p.name, p.version, got, err))
			} else if !ok {
				missing = append(missing, fmt.Sprintf("%s==%s (installed %s)", p.name, p.version, got))
			}
		}
	}
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("--python %s cannot run the demo's job (%s pins them): missing %s; "+
		"fix: run `make demo` as root (it installs %s), or `apt-get install -y --no-install-recommends %s` as root, "+
		"or pass --python with an interpreter that has them",
		python, specPath, strings.Join(missing, ", "), strings.Join(DemoAptPackages, " "), strings.Join(DemoAptPackages, " "))
}
