package gpupass

import (
	"bytes"
	"io"

	"github.com/gpupass/gpupass/internal/command/output"
	"github.com/gpupass/gpupass/internal/fsutil"
)

// writeJSON prints v as a JSON document in the house form (files such as
// ci's annotations.json); a command's --output goes through output.Write.
func writeJSON(w io.Writer, v any) error { return output.WriteJSON(w, v) }

// writeFile renders in full, then replaces path atomically, so a failed
// or killed run never leaves half a file.
func writeFile(path string, render func(io.Writer) error) error {
	var b bytes.Buffer
	if err := render(&b); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b.Bytes(), 0o644)
}
