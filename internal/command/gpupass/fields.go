package gpupass

import (
	"fmt"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/forge"
	"github.com/gpupass/gpupass/internal/forge/github"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
)

// flagNames renames the libraries' fields (*fielderr.Error) to the
// gpupass flags that set them. Main applies it to every command's error;
// `ci step` applies ciInputNames first, so its users read input names.
// TestFieldNames keeps every entry a real flag or input. The audit
// commands add theirs (AuditPlugin.FieldNames): newFieldNames merges
// them in once, when the root command is built.
var flagNames = fielderr.Names{
	report.FieldLabel:     "--label",
	metrics.FieldMetric:   "--metric",
	forge.FieldBehavior:   "--comment-behavior",
	github.FieldToken:     "--github-token (or GITHUB_TOKEN)",
	bundle.FieldMountFrom: "--mount-from",
	api.FieldCA:           "--tls-ca",
	bundle.FieldUsername:  "--registry-username",
	bundle.FieldPassword:  "--registry-password",
	"jobs":                "--jobs",
}

// ciInputNames renames the same fields to the inputs of the GitHub
// Action and the GitLab components (action.yml, components/gitlab).
// A field with no input of its own (the metric: compare-report reads the
// loss) keeps the library's word.
var ciInputNames = fielderr.Names{
	report.FieldLabel:     "input runs (NAME=FILE)",
	forge.FieldBehavior:   "input comment-behavior",
	github.FieldToken:     "input github-token",
	bundle.FieldMountFrom: "mount source",
	api.FieldCA:           "broker CA file",
	bundle.FieldUsername:  "GPUPASS_REGISTRY_USERNAME",
	bundle.FieldPassword:  "GPUPASS_REGISTRY_PASSWORD",
}

// fieldNames are the tables a command's error is renamed by: the CLI's
// own and the audit commands', merged.
type fieldNames struct{ flags, inputs fielderr.Names }

// fieldNames are g's tables: NewRoot's, or for a GlobalOptions built by
// hand (RunCIStep called as a library), made from its Audit plugin.
func (g *GlobalOptions) fieldNames() fieldNames {
	switch {
	case g == nil:
		return fieldNames{flags: flagNames, inputs: ciInputNames}
	case g.names.flags != nil:
		return g.names
	case g.Audit != nil:
		return newFieldNames(g.Audit)
	}
	return fieldNames{flags: flagNames, inputs: ciInputNames}
}

func newFieldNames(p AuditPlugin) fieldNames {
	flags, inputs := p.FieldNames()
	return fieldNames{flags: mergeNames(flagNames, flags), inputs: mergeNames(ciInputNames, inputs)}
}

// mergeNames is base with extra's entries added. A field both name is a
// programming error (one would silently win): it panics, and every test
// that builds the root command finds it.
func mergeNames(base, extra fielderr.Names) fielderr.Names {
	if len(extra) == 0 {
		return base
	}
	m := make(fielderr.Names, len(base)+len(extra))
	for k, v := range base {
		m[k] = v
	}
	for k, v := range extra {
		if old, dup := m[k]; dup && old != v {
			panic(fmt.Sprintf("field %q is named both %q and %q", k, old, v))
		}
		m[k] = v
	}
	return m
}
