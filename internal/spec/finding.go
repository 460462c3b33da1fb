package spec

import (
	"cmp"
	"slices"
)

// Severity of a finding. Only errors make a spec invalid.
type Severity string

// Severities, most severe first.
const (
	SevError   Severity = "error"
	SevWarning Severity = "warning"
	SevInfo    Severity = "info"
)

// Finding is one problem in a spec, positioned in its file.
type Finding struct {
	Rule     string   `json:"rule"`
	Severity Severity `json:"severity"`
	File     string   `json:"file"`
	Line     int      `json:"line"`
	Column   int      `json:"column"`
	// Path is the dotted key path the finding is about
	// ("runtime.packages[2]"); empty for file-level findings.
	Path    string `json:"path,omitempty"`
	Message string `json:"message"`
	Fix     string `json:"fix,omitempty"`
}

// Rule describes a rule id for catalogues (SARIF's tool.driver.rules).
type Rule struct {
	ID       string
	Severity Severity // default severity
	Summary  string
}

// Rules is the catalogue of every rule id a finding may carry. Ids are
// stable: pipelines and suppressions refer to them, so never rename one.
var Rules = []Rule{
	{"yaml.syntax", SevError, "the file is not valid YAML"},
	{"yaml.encoding", SevError, "the file is not UTF-8 text"},
	{"yaml.empty", SevError, "the file holds no spec"},
	{"yaml.too-large", SevError, "the file is larger than a spec can be"},
	{"yaml.aliases", SevError, "too many YAML aliases (alias-expansion bomb)"},
	{"yaml.multiple-documents", SevError, "a spec is one YAML document"},
	{"yaml.duplicate-key", SevError, "a key appears twice in one mapping"},
	{"yaml.unknown-key", SevError, "a key the schema does not define"},
	{"yaml.type", SevError, "a value of the wrong type"},
	{"spec.required", SevError, "a required field is missing or empty"},
	{"spec.truncated", SevError, "too many findings; the rest are not shown"},
	{"cuda.exact-version", SevError, "CUDA must be exact major.minor.patch"},
	{"cuda.unknown-release", SevWarning, "a CUDA release gpupass has no data for"},
	{"driver.version", SevError, "the NVIDIA driver must be a full version"},
	{"driver.too-old", SevError, "the driver is older than the CUDA toolkit needs"},
	{"python.version", SevError, "the Python version is malformed or not exact"},
	{"torch.version", SevError, "the PyTorch version is malformed"},
	{"torch.local-tag", SevError, "the PyTorch version lacks its CUDA local tag"},
	{"torch.cuda-mismatch", SevError, "the PyTorch CUDA tag disagrees with runtime.cuda"},
	{"torch.unpublished", SevError, "PyTorch never published this (version, CUDA) pair"},
	{"torch.unknown-release", SevWarning, "a PyTorch release gpupass has no data for"},
	{"torch.python-unsupported", SevError, "the PyTorch release does not support this Python"},
	{"package.syntax", SevError, "a package line is not a PEP 508 requirement"},
	{"package.unpinned", SevError, "a package is not pinned with =="},
	{"package.duplicate", SevError, "a package is listed twice"},
	{"package.torch-conflict", SevError, "runtime.packages pins torch differently from runtime.pytorch"},
	{"package.cuda-unsupported", SevError, "a compiled CUDA package does not support the declared toolkit"},
	{"package.nvcc-build", SevWarning, "a package compiles CUDA code with the node's nvcc"},
	{"malloc.needs-async", SevError, "the release threshold needs cuda-malloc-async: true"},
	{"malloc.driver-too-old", SevError, "the release threshold needs driver >= 535.86.01"},
	{"malloc.size", SevError, "the release threshold is not a positive size"},
	{"bundle.required", SevError, "no-internet-access needs runtime.bundle"},
	{"bundle.reference", SevError, "runtime.bundle is not an OCI reference"},
	{"bundle.by-tag", SevInfo, "the bundle is referenced by a mutable tag"},
	{"bundle.digest-required", SevError, "no-internet-access needs runtime.bundle pinned by digest"},
	{"resources.accelerator", SevError, "unknown accelerator class"},
	{"resources.accelerator-cuda", SevError, "the accelerator needs a newer CUDA"},
	{"resources.count", SevError, "the accelerator count must be at least 1"},
	{"resources.nodes", SevError, "the node count must be 1 to 1024 and divide resources.count"},
	{"resources.storage-type", SevError, "unknown storage type"},
	{"resources.size", SevError, "sizes must be positive"},
	{"resources.time-limit", SevError, "the time limit is not a duration from 1s to 30 days"},
	{"resources.queue-timeout", SevError, "the queue timeout is not a duration from 1s to 7 days"},
	{"metrics.pattern", SevError, "the metric pattern is not a Go regular expression with a value group"},
}

// sortFindings orders findings by position, then rule, so output is
// stable whatever order the rules ran in.
func sortFindings(fs []Finding) {
	slices.SortStableFunc(fs, func(a, b Finding) int {
		return cmp.Or(
			cmp.Compare(a.File, b.File),
			cmp.Compare(a.Line, b.Line),
			cmp.Compare(a.Column, b.Column),
			cmp.Compare(a.Rule, b.Rule),
			cmp.Compare(a.Message, b.Message),
		)
	})
}

// Counts returns the number of errors and warnings in fs.
func Counts(fs []Finding) (errors, warnings int) {
	for _, f := range fs {
		switch f.Severity {
		case SevError:
			errors++
		case SevWarning:
			warnings++
		}
	}
	return errors, warnings
}
