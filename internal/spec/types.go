// Package spec parses and validates the environment spec (gpupass.yaml, or
// lightning-cloud.yaml), and computes its fingerprint. It is pure: no I/O
// beyond the bytes it is given, no network code.
package spec

// Spec is a parsed environment spec. Fields hold the values as written
// (trimmed); normalised forms are produced by the fingerprint code.
type Spec struct {
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	Runtime     Runtime   `json:"runtime"`
	Security    Security  `json:"security"`
	Resources   Resources `json:"resources"`
	// Metrics says how to read the run's metrics from its output. Like
	// resources it is not part of the fingerprint: how a log is read
	// does not change what the job runs in.
	Metrics Metrics `json:"metrics,omitzero"`
}

// Metrics says how to read a run's metrics.
type Metrics struct {
	// Pattern is a Go regular expression (RE2) with a named group for the
	// value, (?P<loss>…) or (?P<value>…), and optionally (?P<step>…),
	// that finds the loss in a script's own log lines
	// (metrics.CompilePattern); empty reads the built-in forms.
	Pattern string `json:"pattern,omitempty"`
}

// Runtime is the declared software environment. With Security it makes
// up the fingerprint.
type Runtime struct {
	CUDA                            string   `json:"cuda"`
	NvidiaDriver                    string   `json:"nvidia-driver"`
	Python                          string   `json:"python"`
	PyTorch                         string   `json:"pytorch"`
	CUDAMallocAsync                 bool     `json:"cuda-malloc-async"`
	CUDAMallocAsyncReleaseThreshold string   `json:"cuda-malloc-async-release-threshold,omitempty"`
	Packages                        []string `json:"packages"`
	// Bundle is an OCI reference (by tag or digest) of the wheel bundle
	// that jobs install from when security.no-internet-access is set.
	Bundle string `json:"bundle,omitempty"`
}

// Security holds the security requirements of the environment.
type Security struct {
	FIPSCompliant    bool `json:"fips-compliant"`
	NoInternetAccess bool `json:"no-internet-access"`
}

// Resources are placement constraints. They are not part of the
// fingerprint: a provider may swap an A100 for an H100 and the job stays
// the same.
type Resources struct {
	Accelerator string `json:"accelerator"`
	// Count is the run's total accelerators, over all its nodes.
	Count int `json:"count"`
	// Nodes, when set, is how many nodes the run's Count is spread over,
	// evenly; 0 (left out) lets the broker choose the fewest. A placement
	// request like Count: not part of the fingerprint. Omitted when 0, so
	// a spec without it travels (Encode) exactly as before.
	Nodes   int     `json:"nodes,omitempty"`
	Storage Storage `json:"storage"`
	Network Network `json:"network"`
	// TimeLimit is the run's wall-clock limit as written ("90m", "2h";
	// ParseTimeLimit); empty for none. gpupass train --time-limit
	// overrides it. Like all resources it is not part of the fingerprint:
	// how long a job may run does not change what it runs in.
	TimeLimit string `json:"time-limit,omitempty"`
	// QueueTimeout bounds how long a run waits in its region's queue for
	// a busy node, as written ("10m"; ParseQueueTimeout); empty for no
	// bound. gpupass train --queue-timeout overrides it. Scheduling, not
	// environment: it is not part of the fingerprint.
	QueueTimeout string `json:"queue-timeout,omitempty"`
}

// Storage is the storage constraint.
type Storage struct {
	Type   string `json:"type"` // standard | high-iops-nvme | ultra-nvme
	SizeGB int    `json:"size_gb"`
}

// Network is the network constraint.
type Network struct {
	BandwidthGbps      float64 `json:"bandwidth_gbps"`
	LatencyToleranceMS float64 `json:"latency_tolerance_ms"`
}
