package gpupass

import (
	"fmt"
	"io"
)

// groupLine prints the run group of a submission under its runs: the one
// id that names them all (`gpupass runs --group`, the broker's webhook).
func groupLine(out io.Writer, group string) {
	if group != "" {
		fmt.Fprintf(out, "run group %s: list it with gpupass runs --group %s\n", group, group)
	}
}
