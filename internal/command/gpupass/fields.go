package gpupass

import (
	"fmt"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/forge"
	"github.com/gpupass/gpupass/internal/metrics"
	"github.com/gpupass/gpupass/internal/report"
)

// flagNames renames the libraries' fields (*fielderr.Error) to the
// gpupass flags that set them. Main applies it to every command's error;
// `ci step` applies ciInputNames first, so its users read input names.
// TestFieldNames keeps every entry a real flag or input. The audit and
// bundle commands add theirs (Plugin.FieldNames): newFieldNames merges
// them in once, when the root command is built.
var flagNames = fielderr.Names{
	report.FieldLabel:      "--label",
	metrics.FieldMetric:    "--metric",
	forge.FieldBehavior:    "--comment-behavior",
	forge.FieldGitHubToken: "--github-token (or GITHUB_TOKEN)",
	api.FieldCA:            "--tls-ca",
	api.FieldInsecureHTTP:  "--insecure-http (or GPUPASS_INSECURE_HTTP=true)",
}

// ciInputNames renames the same fields to the inputs of the GitHub
// Action and the GitLab components (action.yml, components/gitlab).
// A field with no input of its own (the metric: compare-report reads the
// loss) keeps the library's word.
var ciInputNames = fielderr.Names{
	report.FieldLabel:      "input runs (NAME=FILE)",
	forge.FieldBehavior:    "input comment-behavior",
	forge.FieldGitHubToken: "input github-token",
	api.FieldCA:            "broker CA file",
	api.FieldInsecureHTTP:  "GPUPASS_INSECURE_HTTP=true (a CI/CD variable, or the step's env)",
}

// fieldNames are the tables a command's error is renamed by: the CLI's
// own and the audit commands', merged.
type fieldNames struct{ flags, inputs fielderr.Names }

// fieldNames are g's tables: NewRoot's, or for a GlobalOptions built by
// hand (RunCIStep called as a library), made from its plugins.
func (g *GlobalOptions) fieldNames() fieldNames {
	switch {
	case g == nil:
		return fieldNames{flags: flagNames, inputs: ciInputNames}
	case g.names.flags != nil:
		return g.names
	case g.Audit != nil || g.Bundle != nil:
		return newFieldNames(g.Audit, g.Bundle)
	}
	return fieldNames{flags: flagNames, inputs: ciInputNames}
}

// newFieldNames are the CLI's tables with the linked plugins' (nil when
// not linked) merged in.
func newFieldNames(plugins ...Plugin) fieldNames {
	n := fieldNames{flags: flagNames, inputs: ciInputNames}
	for _, p := range plugins {
		if p == nil {
			continue
		}
		flags, inputs := p.FieldNames()
		n = fieldNames{flags: mergeNames(n.flags, flags), inputs: mergeNames(n.inputs, inputs)}
	}
	return n
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
