package report

import (
	"encoding/json"
	"fmt"
	"io"
)

// JSON writes the report for machines.
func JSON(w io.Writer, r *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("encoding report: %w", err)
	}
	return nil
}
