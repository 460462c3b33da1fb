package gpupass

import (
	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/workdir"
)

// ArchiveDir is archiveDir under the default limits, for the external
// tests.
func ArchiveDir(dir string) ([]byte, error) { return archiveDir(dir, workdir.Default()) }

// ArchiveDirLimits is archiveDir for the external tests.
var ArchiveDirLimits = archiveDir

// outputFormat is s as an --output value (tests loop over plain strings).
func outputFormat(s string) output.Format { return output.Format(s) }

// GitHubPR is the fake pull request of the compare tests (acme/train#7,
// GITHUB_API_URL its server), for the external tests.
type GitHubPR = githubPR

// GitLabMR is the fake merge request of the compare tests (project 4,
// MR 2 under CI_API_V4_URL), for the external tests.
type GitLabMR = gitlabMR
