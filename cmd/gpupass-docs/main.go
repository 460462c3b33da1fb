// Command gpupass-docs writes the CLI reference of every gpupass binary
// into docs/cli, and the agent's executors' flags into
// internal/command/executorflags/executors.json, which gpupass up embeds
// (`make docs`); its test fails when either is stale. It is a
// development tool, not shipped.
package main

import (
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gpupass/gpupass/internal/app/compare/forgepost"
	agentcmd "github.com/gpupass/gpupass/internal/command/agent"
	brokercmd "github.com/gpupass/gpupass/internal/command/broker"
	"github.com/gpupass/gpupass/internal/command/docsgen"
	"github.com/gpupass/gpupass/internal/command/executorflags"
	"github.com/gpupass/gpupass/internal/command/gpupass"
	"github.com/gpupass/gpupass/internal/command/gpupass/auditcmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/bundlecmd"
	"github.com/gpupass/gpupass/internal/command/gpupass/modelcmd"
	loadgencmd "github.com/gpupass/gpupass/internal/command/loadgen"
)

// dir is where the reference lives, from the repository root.
const dir = "docs/cli"

// executors are the agent's executors (its default build's) as the data
// gpupass up embeds, written to executorflags.File.
func executors() ([]byte, []executorflags.Executor, error) {
	es, err := agentcmd.ExecutorFlags(agentcmd.Backends())
	if err != nil {
		return nil, nil, err
	}
	b, err := executorflags.Marshal(es)
	return b, es, err
}

// trees are the binaries' command trees, built afresh on each call,
// linked as their mains link them; gpupass up's executor flags are es,
// the agent's (not the list gpupass was built with, which may be the
// stale one being replaced).
func trees(es []executorflags.Executor) []docsgen.Tree {
	return []docsgen.Tree{
		{Command: gpupass.NewRoot(gpupass.WithCommands(auditcmd.Command, bundlecmd.Command, modelcmd.Command), gpupass.WithPoster(forgepost.Poster{}), gpupass.WithExecutors(es)),
			Note: "The CLI every pipeline step runs: one binary with every command, the audit, bundle and forge commands included."},
		{Command: brokercmd.NewCommand(), Note: "The control plane (see [operating the broker](../operating-the-broker.md))."},
		{Command: agentcmd.NewCommand(io.Discard), Note: "The daemon on each GPU node or Slurm login node (see [Slurm](../slurm.md) and [Kubernetes](../kubernetes.md))."},
		{Command: loadgencmd.NewCommand(), Note: "A development tool that `make bench` runs; not in release archives (see [development](../development.md))."},
	}
}

func main() {
	out := dir
	if len(os.Args) > 2 {
		fmt.Fprintln(os.Stderr, "usage: gpupass-docs [DIR] (default docs/cli; run from the repository root, where it also writes "+executorflags.File+")")
		os.Exit(2)
	}
	if len(os.Args) == 2 {
		out = os.Args[1]
	}
	b, es, err := executors()
	if err == nil {
		if err = os.WriteFile(filepath.FromSlash(executorflags.File), b, 0o644); err != nil {
			err = fmt.Errorf("%w (run it from the repository root, as make docs does)", err)
		}
	}
	if err == nil {
		err = docsgen.Write(out, trees(es))
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "gpupass-docs: %v\n", err)
		os.Exit(1)
	}
}
