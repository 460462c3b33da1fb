package gpupass

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
)

// allocArg checks that a command got exactly one allocation id. Cobra's
// own check says "accepts 1 arg(s), received 0", which does not say what
// is missing nor where a newcomer finds it.
func allocArg(cmd *cobra.Command, args []string) error {
	switch {
	case len(args) == 0:
		return fmt.Errorf("missing ALLOC: pass the allocation id of a run (alloc-…), as printed by `gpupass train` and listed by `gpupass runs`: %s ALLOC", cmd.CommandPath())
	case len(args) > 1:
		return fmt.Errorf("one ALLOC at a time: got %d arguments (%s)", len(args), strings.Join(args, " "))
	}
	return nil
}
