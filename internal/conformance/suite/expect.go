package suite

import (
	"strings"

	"github.com/gpupass/gpupass/internal/probe"
	"github.com/gpupass/gpupass/internal/spec"
)

// Expectations are what the checks compare against. Every field is
// optional: an empty one means "record what is there" (the agent's
// periodic suite has no spec; a run's start-up check has one).
type Expectations struct {
	NvidiaDriver string
	CUDA         string // toolkit, exact: 12.1.105
	Python       string
	PyTorch      string
	// Packages maps PEP 503 names to pinned versions.
	Packages map[string]string
	FIPS     bool

	Accelerator string
	Count       int
	// StorageClass is the declared class (label or spec): it sets the
	// read throughput floor and whether a network filesystem is allowed.
	StorageClass  string
	StorageSizeGB int
	// MinFreeMemoryPct is the share of each GPU's memory that must be
	// free (default 95: an idle GPU shows a few MiB used by the driver).
	MinFreeMemoryPct float64
	// OwnPIDs are processes the agent itself started (a run's job): they
	// hold GPU memory by right and are not foreign.
	OwnPIDs map[uint32]bool
}

// FromSpec derives expectations from a parsed spec.
func FromSpec(s *spec.Spec) Expectations {
	e := Expectations{
		NvidiaDriver: s.Runtime.NvidiaDriver, CUDA: s.Runtime.CUDA,
		Python: s.Runtime.Python, PyTorch: s.Runtime.PyTorch,
		FIPS:        s.Security.FIPSCompliant,
		Accelerator: s.Resources.Accelerator, Count: s.Resources.Count,
		StorageClass: s.Resources.Storage.Type, StorageSizeGB: s.Resources.Storage.SizeGB,
	}
	e.Packages = PinnedPackages(s)
	return e
}

// PinnedPackages returns the spec's packages as PEP 503 name -> version
// (the version after ==; "" when not pinned with ==).
func PinnedPackages(s *spec.Spec) map[string]string {
	if len(s.Runtime.Packages) == 0 {
		return nil
	}
	m := map[string]string{}
	for _, p := range s.Runtime.Packages {
		req, err := spec.ParseRequirement(p)
		if err != nil {
			name, ver, _ := strings.Cut(p, "==")
			m[probe.NormalizePackage(name)] = strings.TrimSpace(ver)
			continue
		}
		v := ""
		for _, sp := range req.Specs {
			if sp.Op == "==" || sp.Op == "===" {
				v = sp.Version
			}
		}
		m[probe.NormalizePackage(req.Name)] = v
	}
	return m
}

// PackageNames returns the names in e.Packages, for the Python probe.
func (e Expectations) PackageNames() []string {
	var names []string
	for n := range e.Packages {
		names = append(names, n)
	}
	return names
}

// readFloorMBps is the sequential read throughput a storage class
// promises, in MB/s: a conservative floor below what a single local
// NVMe drive of each tier delivers, so that only a mis-sold class trips it.
var readFloorMBps = map[string]float64{
	"standard":       100,
	"high-iops-nvme": 1000,
	"ultra-nvme":     2500,
}

// networkFS are filesystem types that cannot be the local NVMe an nvme
// storage class promises.
var networkFS = map[string]bool{"nfs": true, "nfs4": true, "cifs": true, "smb3": true, "9p": true, "ceph": true, "glusterfs": true, "lustre": true}
