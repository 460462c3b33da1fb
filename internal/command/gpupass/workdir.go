package gpupass

import (
	"errors"
	"fmt"

	"github.com/gpupass/gpupass/internal/api"
	"github.com/gpupass/gpupass/internal/workdir"
)

// maxArchive is the broker's Submit limit less room for the rest.
const maxArchive = api.MaxSubmitBytes - 1<<20

// archiveDir packs a run's work dir (train --workdir, the demo's example)
// with workdir.Pack, and says which flag raises a limit it breaks.
func archiveDir(dir string, l workdir.Limits) ([]byte, error) {
	b, err := workdir.Pack(dir, l, maxArchive)
	return b, limitHint(err)
}

// limitHint adds to a work dir limit error what to do about it.
func limitHint(err error) error {
	var le *workdir.LimitError
	if !errors.As(err, &le) {
		return err
	}
	return fmt.Errorf("%w: ship less (data from storage, not the work dir), or raise --workdir-max-%s (the broker's gpupass-broker serve --workdir-max-%s must allow it too)", err, le.Limit, le.Limit)
}
