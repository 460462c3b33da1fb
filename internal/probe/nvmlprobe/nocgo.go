//go:build !cgo

// Package nvmlprobe reads GPUs through NVML. This build has no cgo, so
// NVML cannot be loaded; the probe says so instead of failing.
package nvmlprobe

import (
	"context"

	"github.com/gpupass/gpupass/internal/probe"
)

type unavailable struct{}

// Default returns a probe that reports NVML as not available.
func Default() probe.Probe { return unavailable{} }

func (unavailable) Name() string { return "gpu" }

func (unavailable) Measure(ctx context.Context) (probe.Section, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return probe.GPUSection{Reason: "NVML not available: built without cgo"}, nil
}
