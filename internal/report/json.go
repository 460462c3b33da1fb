package report

import (
	"encoding/json"
	"fmt"
	"io"
)

// JSON writes the report for machines.
func JSON(w io.Writer, r *Report) error { return EncodeJSON(w, r) }

// EncodeJSON writes v as indented JSON, the one JSON style of reports.
func EncodeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	return nil
}
