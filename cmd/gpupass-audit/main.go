// Command gpupass-audit is gpupass with every command linked in: the
// audit commands (`audit`, `audit verify`, `audit keygen`, the audit CI
// steps: sigstore), the bundle commands (`bundle`, the bundle CI steps:
// go-containerregistry) and posting compare reports (go-github, GitLab's
// client). Those libraries' package initialisation costs every process
// that links them start-up time, so gpupass itself does not link them and
// runs this program for those commands. Ship both together.
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
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := gpupass.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr,
		gpupass.WithAudit(auditcmd.Plugin{}), gpupass.WithBundle(bundlecmd.Plugin{}), gpupass.WithPoster(forgepost.Poster{}))
	stop()
	os.Exit(code)
}
