// Command gpupass is the CLI that every gpupass pipeline step calls.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupass/gpupass/internal/command/gpupass"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := gpupass.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
