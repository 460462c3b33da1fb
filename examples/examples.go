// Package examples holds the starter project that `gpupass init` writes:
// a valid gpupass.yaml, a small training script that reports metrics the
// way the agent reads them, and a README snippet.
package examples

import "embed"

// Starter is the starter project; files sit under "starter/".
//
//go:embed starter/gpupass.yaml starter/train.py starter/GPUPASS.md
var Starter embed.FS
