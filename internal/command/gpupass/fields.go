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
// gpupass flags that set them. Main applies it to every command's error,
// with each flag's variable and CI input under -o github|gitlab
// (ciFlagNames). TestFieldNames keeps every entry a real flag. The audit
// and bundle commands add theirs (Subcommand.FieldNames): newFieldNames
// merges them in once, when the root command is built.
var flagNames = fielderr.Names{
	report.FieldLabel:      "--label",
	metrics.FieldMetric:    "--metric",
	forge.FieldBehavior:    "--comment-behavior",
	forge.FieldGitHubToken: "--github-token (or GITHUB_TOKEN)",
	api.FieldCA:            "--tls-ca",
	api.FieldInsecureHTTP:  "--insecure-http (or GPUPASS_INSECURE_HTTP=true)",
}

// fieldNames are the table a command's error is renamed by: the CLI's
// own and the plugins', merged.
type fieldNames struct{ flags fielderr.Names }

// newFieldNames are the CLI's table with the linked commands' merged in.
func newFieldNames(cmds []Subcommand) fieldNames {
	n := fieldNames{flags: flagNames}
	for _, c := range cmds {
		n.flags = mergeNames(n.flags, c.FieldNames)
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
