// Command gpupass-agent is the gpupass node daemon. See package agent and
// its command layer, internal/command/agent.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	agentcmd "github.com/gpupass/gpupass/internal/command/agent"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := agentcmd.Main(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
