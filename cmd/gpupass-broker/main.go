// Command gpupass-broker is the gpupass control plane.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	brokercmd "github.com/gpupass/gpupass/internal/command/broker"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := brokercmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
