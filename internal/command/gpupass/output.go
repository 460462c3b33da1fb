package gpupass

import (
	"bytes"
	"encoding/json"
	"io"

	"github.com/gpupass/gpupass/internal/fsutil"
)

// writeJSON prints v as the one JSON document of a command's --output json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}

// writeFile renders in full, then replaces path atomically, so a failed
// or killed run never leaves half a file.
func writeFile(path string, render func(io.Writer) error) error {
	var b bytes.Buffer
	if err := render(&b); err != nil {
		return err
	}
	return fsutil.WriteFileAtomic(path, b.Bytes(), 0o644)
}
