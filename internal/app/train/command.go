package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// SplitCommand splits a command line given as one string (the CI
// step's train-command input) into words: a JSON list of
// strings, or words separated by blanks, with '…' and "…" quoting and \
// escapes as a POSIX shell reads them (no expansion of any kind: the
// node runs the words directly, never through a shell).
func SplitCommand(s string) ([]string, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "[") {
		var words []string
		if err := json.Unmarshal([]byte(s), &words); err != nil {
			return nil, fmt.Errorf("not a JSON list of strings: %w", err)
		}
		if len(words) == 0 {
			return nil, errors.New("empty JSON list")
		}
		return words, nil
	}
	var (
		words []string
		cur   strings.Builder
		in    bool // inside a word
		quote rune
	)
	rs := []rune(s)
	for i := 0; i < len(rs); i++ {
		c := rs[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteRune(c)
			}
		case quote == '"':
			switch {
			case c == '"':
				quote = 0
			case c == '\\' && i+1 < len(rs) && strings.ContainsRune(`"\$`+"`", rs[i+1]):
				i++
				cur.WriteRune(rs[i])
			default:
				cur.WriteRune(c)
			}
		case c == '\'' || c == '"':
			quote, in = c, true
		case c == '\\':
			if i+1 == len(rs) {
				return nil, errors.New("ends with a backslash")
			}
			i++
			cur.WriteRune(rs[i])
			in = true
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			if in {
				words = append(words, cur.String())
				cur.Reset()
				in = false
			}
		default:
			cur.WriteRune(c)
			in = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if in {
		words = append(words, cur.String())
	}
	if len(words) == 0 {
		return nil, errors.New("empty")
	}
	return words, nil
}
