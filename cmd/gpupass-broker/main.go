// Command gpupass-broker is the gpupass control plane.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupass/gpupass/broker/brokercli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := brokercli.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
