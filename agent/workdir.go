package agent

import "github.com/gpupass/gpupass/internal/workdir"

// unpackWorkdir extracts a run's work dir archive under the agent's
// limits (--workdir-max-*, which should match the broker's); the rules
// live in workdir.Unpack.
func unpackWorkdir(archive []byte, dir string, lim workdir.Limits) error {
	return workdir.Unpack(archive, dir, lim)
}
