package gpupass

import (
	"encoding/json"
	"io"
)

// writeJSON prints v as the one JSON document of a command's --output json.
func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
