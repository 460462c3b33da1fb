module github.com/gpupass/gpupass

go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/google/go-cmp v0.7.0
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	google.golang.org/protobuf v1.36.12
)

require github.com/inconshreveable/mousetrap v1.1.0 // indirect
