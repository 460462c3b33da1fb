// Command gpupass-loadgen drives gpupass brokers with a simulated fleet
// over the real protocol and reports latencies and lost records (#21).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	loadgencmd "github.com/gpupass/gpupass/internal/command/loadgen"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := loadgencmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
