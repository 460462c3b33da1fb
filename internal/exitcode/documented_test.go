package exitcode_test

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/exitcode"
)

// Pipelines branch on the exit codes, so each one is in the lists users
// read: the README's "Exit codes and environment" and troubleshooting's
// first paragraph (gpupass --help is generated into docs/cli/gpupass.md).
func TestEveryCodeDocumented(t *testing.T) {
	t.Parallel()
	// go test runs in the package's directory.
	root := filepath.Join("..", "..")
	lists := map[string]func(string) string{
		"README.md": func(s string) string {
			_, after, _ := strings.Cut(s, "## Exit codes and environment")
			before, _, _ := strings.Cut(strings.TrimLeft(after, "\n"), "\n\n")
			return before
		},
		"docs/troubleshooting.md": func(s string) string {
			before, _, _ := strings.Cut(s, "\n\n## ")
			return before
		},
		"docs/cli/gpupass.md": func(s string) string {
			_, after, _ := strings.Cut(s, "Exit codes:")
			before, _, _ := strings.Cut(strings.TrimLeft(after, "\n"), "\n\n")
			return before
		},
	}
	for file, section := range lists {
		b, err := os.ReadFile(filepath.Join(root, file))
		if err != nil {
			t.Fatal(err)
		}
		list := section(string(b))
		for _, code := range []int{exitcode.OK, exitcode.Findings, exitcode.Usage, exitcode.Timeout} {
			// "`3`" in markdown, "3 " after a space or a line break in help text.
			if !regexp.MustCompile(fmt.Sprintf("(`|\\s)%d(`|\\s)", code)).MatchString(list) {
				t.Errorf("%s: exit code %d is not in its exit-code list:\n%s", file, code, list)
			}
		}
	}
}
