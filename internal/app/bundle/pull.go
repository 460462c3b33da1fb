package bundle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/gpupass/gpupass/internal/bundle"
	"github.com/gpupass/gpupass/internal/fielderr"
)

// PullOptions say which bundle to pull where.
type PullOptions struct {
	Ref string
	// To is the directory to write the wheelhouse to; it must not exist
	// or be empty.
	To       string
	Registry bundle.RegistryOptions
	// Fsync syncs every wheel before the wheelhouse is moved into place.
	Fsync bool
	// VerifyRecord re-checks every wheel's RECORD hashes (always done for
	// artifacts without a gpupass lock layer).
	VerifyRecord bool
	Progress     io.Writer
	TTY          bool
	Logger       *slog.Logger
}

// Pull fetches and verifies a bundle into To. A failed verification is a
// finding (exit code 1) wrapping bundle.ErrVerification.
func Pull(ctx context.Context, o PullOptions) (*bundle.PullResult, error) {
	if o.To == "" {
		return nil, &fielderr.Error{Field: "To", Problem: "is required: " + "the directory to write the wheelhouse to"}
	}
	popts := bundle.PullOptions{Registry: o.Registry, Logger: o.Logger, Sync: o.Fsync, VerifyRecord: o.VerifyRecord}
	var prog *bundle.TextProgress
	if o.Progress != nil {
		prog = bundle.NewTextProgress(o.Progress, o.TTY, "pulled")
		popts.Progress = prog
	}
	res, err := bundle.Pull(ctx, o.Ref, o.To, popts)
	if prog != nil {
		prog.Finish()
	}
	if errors.Is(err, bundle.ErrVerification) {
		return nil, findings(err)
	}
	if err != nil {
		return nil, err
	}
	return &res, nil
}

// RenderPull prints the reference and where the wheels went, or with
// json everything.
func RenderPull(w io.Writer, r *bundle.PullResult, json bool) error {
	if json {
		return writeJSON(w, r)
	}
	_, err := fmt.Fprintf(w, "%s\n%d wheels in %s\n", r.Reference, len(r.Wheels), r.Dir)
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(v)
}
