package gpupass

import (
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/runview"
)

// stateName is a run state in lower case (running, succeeded…).
func stateName(s gpupassv1.AllocState) string { return runview.State(s) }

func terminal(s gpupassv1.AllocState) bool { return runview.Terminal(s) }
