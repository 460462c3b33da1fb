// Command gpupass is the CLI that every gpupass pipeline step calls. It
// links every command: the audit commands (sigstore), the bundle commands
// (go-containerregistry) and posting compare reports (the forge clients)
// live in their own packages and are assembled here.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/auditcmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/bundlecmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/modelcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := gpupass.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr,
		gpupass.WithCommands(auditcmd.Command, bundlecmd.Command, modelcmd.Command), gpupass.WithPoster(forgepost.Poster{}))
	stop()
	os.Exit(code)
}
