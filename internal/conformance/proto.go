package conformance

import gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"

// This file is the one conversion between the measured Runtime and the
// API's Runtime message (the broker's node listings); TestRuntimeProto
// fails when a field is added to one and not converted.

// Fill sets m, a zero message (one of an answer's slab, say), to r and
// returns it. Packages stay off the wire: the broker indexes no package
// versions (a run checks its own on the node when it starts).
func (r *Runtime) Fill(m *gpupassv1.Runtime) *gpupassv1.Runtime {
	m.NvidiaDriver, m.CudaDriverApi, m.Cuda, m.Python = r.NvidiaDriver, r.CUDADriverAPI, r.CUDA, r.Python
	m.Pytorch, m.TorchCuda, m.Cudnn, m.FipsEnabled = r.PyTorch, r.TorchCUDA, r.CuDNN, r.FIPSEnabled
	return m
}

// ToProto is r as the API's message.
func (r *Runtime) ToProto() *gpupassv1.Runtime {
	return r.Fill(new(gpupassv1.Runtime))
}

// RuntimeFromProto converts a runtime from the broker's API; nil (a node
// without a report) stays nil.
func RuntimeFromProto(m *gpupassv1.Runtime) *Runtime {
	if m == nil {
		return nil
	}
	return &Runtime{NvidiaDriver: m.GetNvidiaDriver(), CUDADriverAPI: m.GetCudaDriverApi(), CUDA: m.GetCuda(),
		Python: m.GetPython(), PyTorch: m.GetPytorch(), TorchCUDA: m.GetTorchCuda(), CuDNN: m.GetCudnn(),
		FIPSEnabled: m.GetFipsEnabled()}
}
