package depcheck

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// flagRE matches a long CLI flag as a user would type it (--tolerance),
// not a bare "--" (end of options) nor a "--" inside a word.
var flagRE = regexp.MustCompile(`(^|[^-\w])--[a-z][a-z0-9]*(-[a-z0-9]+)*`)

// commandDirs are where flags live: the command layer and the mains may
// name them, everything else says what is wrong in its own terms and the
// command layer adds the flag (and under -o github|gitlab its input) (STYLE.md rule 13).
// commandLine matches the text before a flag that belongs to a command
// line the message quotes for the user to run (`pip install --no-index`,
// `gpupass logs ID --follow`, `sbatch --parsable`): a whole command says
// which program it is for, whatever brought the user there.
var commandLine = regexp.MustCompile(`(^|[\s('"` + "`" + `])(sbatch|srun|scontrol|pip|nvcc|cosign|useradd|gpupass|gpupass-broker|gpupass-agent)(\s+[^\s;:,()]+)*\s+$`)

var commandDirs = []string{"internal/command", "cmd", "scripts", "examples", "deploy", "docs", "components"}

// TestLibraryErrorsNameNoFlags fails when an error built in a library
// package names a --flag: a user who came through a Go caller, the
// Action or a GitLab component never typed that flag. It reads the format
// string of every fmt.Errorf and errors.New, and every string in an
// Error() method, outside the command layer.
func TestLibraryErrorsNameNoFlags(t *testing.T) {
	t.Parallel()
	root := testutil.RepoRoot(t)
	var found []string
	fset := token.NewFileSet()
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		rel = filepath.ToSlash(rel)
		if d.IsDir() {
			name := d.Name()
			if rel != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "node_modules") {
				return filepath.SkipDir
			}
			for _, c := range commandDirs {
				if rel == c {
					return filepath.SkipDir
				}
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		if f.Name.Name == "main" {
			return nil
		}
		for _, s := range errorStrings(f) {
			for _, m := range flagRE.FindAllStringIndex(s.text, -1) {
				if dash := m[0] + strings.Index(s.text[m[0]:m[1]], "--"); commandLine.MatchString(s.text[:dash]) {
					continue
				}
				p := fset.Position(s.pos)
				found = append(found, rel+":"+strconv.Itoa(p.Line)+": "+strings.TrimLeft(s.text[m[0]:m[1]], " \t\n('\"`")+" in "+strconv.Quote(s.text))
				break
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range found {
		t.Error(f)
	}
	if len(found) > 0 {
		t.Errorf("%d library error messages name a CLI flag: return the problem in library terms (internal/fielderr) and let the command layer name the flag or input", len(found))
	}
}

type errString struct {
	pos  token.Pos
	text string
}

// errorStrings are the string literals that become error text in f.
func errorStrings(f *ast.File) []errString {
	var out []errString
	lits := func(e ast.Node) {
		ast.Inspect(e, func(n ast.Node) bool {
			if bl, ok := n.(*ast.BasicLit); ok && bl.Kind == token.STRING {
				if s, err := strconv.Unquote(bl.Value); err == nil {
					out = append(out, errString{bl.Pos(), s})
				}
			}
			return true
		})
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.FuncDecl:
			if n.Recv != nil && n.Name.Name == "Error" && n.Body != nil {
				lits(n.Body)
				return false
			}
		case *ast.CallExpr:
			sel, ok := n.Fun.(*ast.SelectorExpr)
			if !ok || len(n.Args) == 0 {
				return true
			}
			pkg, ok := sel.X.(*ast.Ident)
			if !ok {
				return true
			}
			if (pkg.Name == "fmt" && sel.Sel.Name == "Errorf") || (pkg.Name == "errors" && sel.Sel.Name == "New") {
				lits(n.Args[0])
			}
		}
		return true
	})
	return out
}
