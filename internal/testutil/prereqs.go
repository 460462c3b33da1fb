package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// Prereqs is what a real component a test starts (a Slurm cluster, the
// Kubernetes test cluster) needs from this machine.
type Prereqs struct {
	// Root, when set, says what needs root.
	Root string
	// Tools must be on PATH or in /usr/sbin, where daemons live and a
	// user's PATH may not reach.
	Tools []string
	// Install says what installs the tools: the scripts/setup.d script
	// and its packages.
	Install string
}

// Missing says the first thing of p this machine lacks, "" when none.
func (p Prereqs) Missing() string {
	if p.Root != "" && os.Geteuid() != 0 {
		return p.Root
	}
	for _, tool := range p.Tools {
		if _, err := exec.LookPath(tool); err != nil {
			if _, serr := os.Stat(filepath.Join("/usr/sbin", tool)); serr != nil {
				return fmt.Sprintf("%s not installed (%s)", tool, p.Install)
			}
		}
	}
	return ""
}

// Require stops the test as Missing does when the machine lacks any of p.
func (p Prereqs) Require(t testing.TB) {
	t.Helper()
	if m := p.Missing(); m != "" {
		Missing(t, "%s", m)
	}
}
