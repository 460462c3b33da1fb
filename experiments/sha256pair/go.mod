module github.com/gpupass/gpupass/experiments/sha256pair

go 1.26
