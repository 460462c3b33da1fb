// Package examples holds the example project: the real PyTorch training
// script (train/train.py) that the demo and the end-to-end tests run, and
// the starter files that `gpupass init` writes around it.
package examples

import "embed"

// Files holds the embedded example files.
//
//go:embed starter/gpupass.yaml starter/GPUPASS.md train/train.py
var Files embed.FS

// Starter maps each file `gpupass init` writes (its name in the new
// project) to its path in Files, in the order they are written.
var Starter = []struct{ Name, Path string }{
	{"GPUPASS.md", "starter/GPUPASS.md"},
	{"gpupass.yaml", "starter/gpupass.yaml"},
	{"train.py", "train/train.py"},
}
