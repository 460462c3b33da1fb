package spec

import (
	"fmt"
	"slices"
	"strings"
)

// markerVars are the PEP 508 environment marker variables. extra is
// allowed: a package entry may carry it even though only a containing
// layer defines it.
var markerVars = []string{
	"python_version", "python_full_version", "os_name", "sys_platform",
	"platform_release", "platform_system", "platform_version",
	"platform_machine", "platform_python_implementation",
	"implementation_name", "implementation_version", "extra",
}

// legacyMarkerVars are the older spellings pip (packaging) still accepts.
// They are kept as written: mapping them to the PEP 508 names would be
// semantic normalisation, which the canonical form does not do.
var legacyMarkerVars = []string{
	"os.name", "sys.platform", "platform.version", "platform.machine",
	"platform.python_implementation", "python_implementation",
}

var markerOps = []string{"===", "==", "!=", "<=", ">=", "~=", "<", ">"}

// Fix hints for marker errors, shown with the finding.
const (
	fixMarkerGeneric  = "write `variable op \"value\"`, joined with and / or, e.g. python_version >= \"3.9\" and sys_platform == \"linux\""
	fixMarkerOp       = "compare with ==, !=, <, <=, >, >=, ~=, ===, in or not in, e.g. sys_platform == \"linux\""
	fixMarkerParens   = "close every ( with a )"
	fixMarkerUnopened = "remove the extra ) or add its ("
	fixMarkerString   = "close the string with the quote that opens it; PEP 508 strings have no escapes, so a value holding ' goes in \"…\" and one holding \" in '…'"
)

// MarkerError is an environment marker that is not PEP 508. Fix says how
// to write it; validation shows it with the finding.
type MarkerError struct {
	Msg string
	Fix string
}

func (e *MarkerError) Error() string { return "invalid environment marker: " + e.Msg }

type markerTokKind int

const (
	tokEnd markerTokKind = iota
	tokVar
	tokString
	tokOp // ==, ..., and the keyword in
	tokNot
	tokAnd
	tokOr
	tokOpen
	tokClose
)

type markerTok struct {
	kind markerTokKind
	text string // the variable, the operator, or a string's value without quotes
}

func (t markerTok) String() string {
	switch t.kind {
	case tokEnd:
		return "the end of the marker"
	case tokString:
		return fmt.Sprintf("the string %q", clip(t.text))
	}
	return fmt.Sprintf("%q", t.text)
}

func isMarkerSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'
}

func isMarkerIdent(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.'
}

func isMarkerOpChar(c byte) bool { return strings.IndexByte("<>=!~", c) >= 0 }

// lexMarker splits a marker into tokens, checking each one on its own:
// variables are known, strings closed, operators real.
func lexMarker(s string) ([]markerTok, error) {
	var toks []markerTok
	for i := 0; i < len(s); {
		c := s[i]
		switch {
		case isMarkerSpace(c):
			i++
		case c == '(':
			toks = append(toks, markerTok{tokOpen, "("})
			i++
		case c == ')':
			toks = append(toks, markerTok{tokClose, ")"})
			i++
		case c == '"' || c == '\'':
			end := strings.IndexByte(s[i+1:], c)
			if end < 0 {
				return nil, &MarkerError{Msg: fmt.Sprintf("the string %q is not closed", clip(s[i:])), Fix: fixMarkerString}
			}
			toks = append(toks, markerTok{tokString, s[i+1 : i+1+end]})
			i += end + 2
		case isMarkerOpChar(c):
			j := i
			for j < len(s) && isMarkerOpChar(s[j]) {
				j++
			}
			op := s[i:j]
			if !slices.Contains(markerOps, op) {
				return nil, &MarkerError{Msg: fmt.Sprintf("%q is not a marker operator", op), Fix: fixMarkerOp}
			}
			toks = append(toks, markerTok{tokOp, op})
			i = j
		case isMarkerIdent(c):
			j := i
			for j < len(s) && isMarkerIdent(s[j]) {
				j++
			}
			word := s[i:j]
			i = j
			switch word {
			case "and":
				toks = append(toks, markerTok{tokAnd, word})
			case "or":
				toks = append(toks, markerTok{tokOr, word})
			case "in":
				toks = append(toks, markerTok{tokOp, word})
			case "not":
				toks = append(toks, markerTok{tokNot, word})
			default:
				if !slices.Contains(markerVars, word) && !slices.Contains(legacyMarkerVars, word) {
					return nil, unknownMarkerVar(word)
				}
				toks = append(toks, markerTok{tokVar, word})
			}
		default:
			msg := fmt.Sprintf("unexpected character %q", rune(c))
			if c >= 0x80 {
				msg = "unexpected non-ASCII character"
			}
			if c == '&' || c == '|' {
				return nil, &MarkerError{Msg: msg, Fix: "join comparisons with and / or, e.g. python_version >= \"3.9\" and sys_platform == \"linux\""}
			}
			return nil, &MarkerError{Msg: msg, Fix: fixMarkerGeneric}
		}
	}
	return append(toks, markerTok{kind: tokEnd}), nil
}

func unknownMarkerVar(word string) error {
	if c := word[0]; c >= '0' && c <= '9' {
		return &MarkerError{
			Msg: fmt.Sprintf("value %q is not quoted", clip(word)),
			Fix: fmt.Sprintf("quote the value: \"%s\"", clip(word)),
		}
	}
	msg := fmt.Sprintf("%q is not a marker variable", clip(word))
	fix := "use a PEP 508 marker variable: " + strings.Join(markerVars, ", ")
	if s := suggest(word, markerVars); len(s) > 0 {
		msg += didYouMean(s)
		fix = "write " + s[0]
		if len(s) > 1 {
			fix = "write one of " + strings.Join(s, ", ")
		}
	}
	return &MarkerError{Msg: msg, Fix: fix}
}

// CanonicalMarker checks a PEP 508 environment marker and returns it in
// the one form the fingerprint uses: single spaces around operators and
// and / or, none inside parentheses, strings in double quotes (single
// quotes when the string holds a double quote: PEP 508 has no escapes).
// Variable names, terms, their order and parentheses stay as written, so
// the form is syntactic only: markers that mean the same but are written
// differently ("a and b" / "b and a") still differ.
func CanonicalMarker(s string) (string, error) {
	toks, err := lexMarker(s)
	if err != nil {
		return "", err
	}
	p := markerParser{toks: toks}
	out, err := p.or()
	if err != nil {
		return "", err
	}
	switch t := p.peek(); t.kind {
	case tokEnd:
		return out, nil
	case tokClose:
		return "", &MarkerError{Msg: `")" has no matching "("`, Fix: fixMarkerUnopened}
	default:
		return "", &MarkerError{Msg: fmt.Sprintf("unexpected %s after %q; join comparisons with and / or", t, clip(out)), Fix: fixMarkerGeneric}
	}
}

// markerParser is a recursive descent parser of PEP 508's marker grammar
// that writes the canonical form as it goes.
type markerParser struct {
	toks []markerTok
	pos  int
}

func (p *markerParser) peek() markerTok { return p.toks[p.pos] }

func (p *markerParser) next() markerTok {
	t := p.toks[p.pos]
	if t.kind != tokEnd {
		p.pos++
	}
	return t
}

// or: and ("or" and)*
func (p *markerParser) or() (string, error) {
	return p.joined(tokOr, " or ", p.and)
}

// and: expr ("and" expr)*
func (p *markerParser) and() (string, error) {
	return p.joined(tokAnd, " and ", p.expr)
}

func (p *markerParser) joined(sep markerTokKind, text string, term func() (string, error)) (string, error) {
	out, err := term()
	if err != nil {
		return "", err
	}
	for p.peek().kind == sep {
		p.next()
		t, err := term()
		if err != nil {
			return "", err
		}
		out += text + t
	}
	return out, nil
}

// expr: "(" or ")" | value op value
func (p *markerParser) expr() (string, error) {
	if p.peek().kind == tokOpen {
		p.next()
		inner, err := p.or()
		if err != nil {
			return "", err
		}
		switch t := p.next(); t.kind {
		case tokClose:
			return "(" + inner + ")", nil
		case tokEnd:
			return "", &MarkerError{Msg: `"(" is not closed`, Fix: fixMarkerParens}
		default:
			return "", &MarkerError{Msg: fmt.Sprintf("unexpected %s after %q; join comparisons with and / or", t, clip(inner)), Fix: fixMarkerGeneric}
		}
	}
	left, err := p.value("")
	if err != nil {
		return "", err
	}
	var op string
	switch t := p.next(); t.kind {
	case tokOp:
		op = t.text
	case tokNot:
		if t := p.next(); t.kind != tokOp || t.text != "in" {
			return "", &MarkerError{Msg: `"not" must be followed by "in"`, Fix: fixMarkerOp}
		}
		op = "not in"
	default:
		return "", &MarkerError{Msg: fmt.Sprintf("expected an operator after %q, found %s", clip(left), t), Fix: fixMarkerOp}
	}
	right, err := p.value(op)
	if err != nil {
		return "", err
	}
	return left + " " + op + " " + right, nil
}

// value: a variable or a string; after is the operator before it, for
// the message.
func (p *markerParser) value(after string) (string, error) {
	t := p.next()
	switch t.kind {
	case tokVar:
		return t.text, nil
	case tokString:
		return quoteMarkerString(t.text), nil
	}
	where := "at the start of a comparison"
	if after != "" {
		where = fmt.Sprintf("after %q", after)
	}
	return "", &MarkerError{
		Msg: fmt.Sprintf("expected a marker variable or a quoted string %s, found %s", where, t),
		Fix: fixMarkerGeneric,
	}
}

func quoteMarkerString(s string) string {
	if strings.Contains(s, `"`) {
		return "'" + s + "'"
	}
	return `"` + s + `"`
}
