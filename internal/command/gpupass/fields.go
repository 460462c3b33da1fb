package gpupass

import (
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
// commands add theirs (AuditPlugin.FieldNames).
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
