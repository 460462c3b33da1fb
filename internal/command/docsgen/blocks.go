package docsgen

import (
	"bufio"
	"bytes"
	"fmt"
	"regexp"
	"strings"
)

// Block is a fenced shell block of a Markdown page: what a reader pastes
// into a terminal.
type Block struct {
	Line int    // line of the opening fence, from 1
	Body string // the lines between the fences
	// NotRun is the reason of the marker before the block, "" when it
	// has none: such a block must run on one machine as written.
	NotRun string
}

// Shell blocks are those fenced as sh, bash, shell or console.
var shellInfo = map[string]bool{"sh": true, "bash": true, "shell": true, "console": true}

// marker is the comment that excuses the block right after it (blank
// lines between are allowed) from being run, with the reason:
//
//	<!-- not-run: needs a Slurm cluster -->
//	<!-- needs: cluster -->
var marker = regexp.MustCompile(`^<!--\s*(not-run|needs):\s*(.*?)\s*-->\s*$`)

// MarkerHelp says how to mark a block, for errors.
const MarkerHelp = "put `<!-- not-run: REASON -->` or `<!-- needs: cluster -->` on the line before its fence"

// ShellBlocks returns the fenced shell blocks of a Markdown page. A marker
// with no reason, or one that no shell block follows, is an error naming
// its line.
func ShellBlocks(src []byte) ([]Block, error) {
	var (
		blocks   []Block
		pending  string // a marker's reason waiting for its block
		markLine int
		fence    string // the open fence ("```", "~~~~"), "" outside one
		cur      *Block
		body     []string
	)
	sc := bufio.NewScanner(bytes.NewReader(src))
	sc.Buffer(make([]byte, 0, 64*1024), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence != "" {
			if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, fence[:1]) == "" {
				if cur != nil {
					cur.Body = strings.Join(body, "\n")
					blocks = append(blocks, *cur)
				}
				fence, cur, body = "", nil, nil
				continue
			}
			if cur != nil {
				body = append(body, line)
			}
			continue
		}
		if f, info, ok := openFence(trimmed); ok {
			fence = f
			if shellInfo[info] {
				cur = &Block{Line: n, NotRun: pending}
			} else if pending != "" {
				return nil, fmt.Errorf("line %d: the not-run marker is followed by a %q block, not a shell block", markLine, info)
			}
			pending = ""
			continue
		}
		if m := marker.FindStringSubmatch(trimmed); m != nil {
			if m[2] == "" {
				return nil, fmt.Errorf("line %d: %s marker without a reason: %s", n, m[1], MarkerHelp)
			}
			pending, markLine = m[1]+": "+m[2], n
			continue
		}
		if trimmed != "" && pending != "" {
			return nil, fmt.Errorf("line %d: the not-run marker is followed by text, not a shell block", markLine)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if fence != "" {
		return nil, fmt.Errorf("a fenced block is never closed")
	}
	if pending != "" {
		return nil, fmt.Errorf("line %d: the not-run marker is followed by no shell block", markLine)
	}
	return blocks, nil
}

// openFence says whether line opens a fenced block: its fence and its
// info string's first word.
func openFence(line string) (fence, info string, ok bool) {
	for _, c := range []string{"`", "~"} {
		n := len(line) - len(strings.TrimLeft(line, c))
		if n >= 3 {
			info, _, _ = strings.Cut(strings.TrimSpace(line[n:]), " ")
			return line[:n], info, true
		}
	}
	return "", "", false
}
