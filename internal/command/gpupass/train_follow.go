package gpupass

import (
	"fmt"
	"io"

	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/runview"
	"github.com/gpupass/gpupass/internal/termsafe"
)

// followHint says, on stderr (stdout is the table), how to follow each
// run that has not ended (the command `cancel` prints too), and how to
// wait for them all: `gpupass wait` with the group, or their ids.
func followHint(errOut io.Writer, runs []*gpupassv1.Run, group string) {
	var open []string
	for _, r := range runs {
		if !runview.Terminal(r.State) {
			fmt.Fprintf(errOut, "follow %s with: gpupass logs --follow %s\n", termsafe.String(r.Region), r.Id)
			open = append(open, r.Id)
		}
	}
	if len(open) > 0 {
		fmt.Fprintf(errOut, "wait for every run to end (exit code as train --follow) with: %s\n", waitCommand(group, open))
	}
}
