// Command gpupass-audit is gpupass with the audit commands linked in
// (`audit`, `audit verify`, `audit keygen` and the audit CI steps). They
// sign and verify with sigstore, whose packages cost every process that
// links them about 10 ms at start-up, so gpupass itself does not link
// them and runs this program for those commands. Ship both together.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/auditcmd"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := gpupass.Main(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr, gpupass.WithAudit(auditcmd.Plugin{}))
	stop()
	os.Exit(code)
}
