//go:build e2e

package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/command/docsgen"
	"github.com/gpupass/gpupass/internal/testutil"
)

// blockTimeout bounds one block: what the docs show a user on one
// machine takes seconds.
const blockTimeout = 2 * time.Minute

// TestDocsShellBlocks runs every unmarked shell block of README.md and
// docs/*.md as a user who pastes it would: each page's blocks in order
// in one fresh directory and HOME, under bash -e -o pipefail, with the
// binaries built from this checkout first on PATH and no GPUPASS_*
// variable set. A block that fails names its page and line.
func TestDocsShellBlocks(t *testing.T) {
	bins := []string{
		testutil.BuildBinary(t, "./cmd/gpupass"),
		testutil.BuildBinary(t, "./cmd/gpupass-broker"),
		testutil.BuildBinary(t, "./cmd/gpupass-agent"),
	}
	var dirs []string
	for _, b := range bins {
		dirs = append(dirs, filepath.Dir(b))
	}
	path := strings.Join(append(dirs, "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"), ":")
	bash := testutil.Tool(t, "bash")
	for _, p := range pages(t) {
		t.Run(p.path, func(t *testing.T) {
			dir := t.TempDir()
			for _, b := range p.blocks {
				if b.NotRun != "" {
					continue
				}
				ctx, cancel := context.WithTimeout(context.Background(), blockTimeout)
				cmd := exec.CommandContext(ctx, bash, "--noprofile", "--norc", "-e", "-o", "pipefail", "-c", b.Body)
				cmd.Dir = dir
				cmd.Env = []string{"PATH=" + path, "HOME=" + dir, "LANG=C.UTF-8", "TMPDIR=" + t.TempDir()}
				// A block's background processes go with it.
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
				cmd.WaitDelay = 5 * time.Second
				out, err := cmd.CombinedOutput()
				if ctx.Err() != nil {
					err = fmt.Errorf("%w after %s", ctx.Err(), blockTimeout)
				}
				cancel()
				if err != nil {
					t.Errorf("%s:%d: block failed (%v); fix it or mark it: %s\n--- block\n%s\n--- output\n%s",
						p.path, b.Line, err, docsgen.MarkerHelp, b.Body, out)
				}
			}
		})
	}
}
