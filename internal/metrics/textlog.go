package metrics

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// MaxPatternLen bounds a metric pattern. RE2 matches in linear time
// whatever the pattern, but a pattern's program grows with its length and
// the agent compiles the one a job's spec carries.
const MaxPatternLen = 1024

// Pattern is a metric pattern: a Go regular expression (RE2 syntax) with a
// named group for the value, (?P<value>…) or (?P<loss>…), and an optional
// one for the step, (?P<step>…). A line it does not match is ordinary
// output; a line without a step takes its place in the line order.
type Pattern struct {
	expr  string
	re    *regexp.Regexp
	value int // submatch index of the value group
	step  int // submatch index of the step group, -1 if none
}

// PatternError says why a metric pattern is unusable, and how to write one
// that is.
type PatternError struct {
	Problem string
	Fix     string
}

func (e *PatternError) Error() string { return e.Problem + "; " + e.Fix }

// PatternExample is a pattern for a line such as
// `step 120 | lr 0.1 | loss: 2.31`, for messages.
const PatternExample = `step (?P<step>\d+).*loss[:= ]+(?P<loss>[-+.0-9eE]+|nan|inf)`

// lookaround finds what Perl and Python regular expressions have and RE2
// does not: lookarounds and backreferences.
var lookaround = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`\(\?(?:=|!|<=|<!)|\\[1-9]`) })

// CompilePattern checks and compiles a metric pattern. It is the one
// rule for the spec field metrics.pattern and the --metric-pattern flags.
func CompilePattern(expr string) (*Pattern, error) {
	fix := "write a Go regular expression (RE2) with a named group for the value, e.g. `" + PatternExample + "`"
	if strings.TrimSpace(expr) == "" {
		return nil, &PatternError{"the pattern is empty", fix}
	}
	if len(expr) > MaxPatternLen {
		return nil, &PatternError{fmt.Sprintf("the pattern is %d bytes long, more than %d", len(expr), MaxPatternLen), fix}
	}
	re, err := regexp.Compile(expr)
	if err != nil {
		msg := err.Error()
		if lookaround().MatchString(expr) {
			fix = "Go regular expressions (RE2) do not support lookarounds ((?=…), (?!…), (?<=…), (?<!…)) or backreferences (\\1); " + fix
		}
		return nil, &PatternError{"not a valid regular expression: " + msg, fix}
	}
	p := &Pattern{expr: expr, re: re, value: -1, step: -1}
	for i, name := range re.SubexpNames() {
		switch name {
		case "value", "loss":
			if p.value >= 0 {
				return nil, &PatternError{"the pattern has more than one value group ((?P<value>…) or (?P<loss>…))", "keep one"}
			}
			p.value = i
		case "step":
			p.step = i
		}
	}
	if p.value < 0 {
		return nil, &PatternError{"the pattern has no group named value or loss", "name the group that holds the number (?P<loss>…), e.g. `" + PatternExample + "`"}
	}
	return p, nil
}

// String is the pattern as written.
func (p *Pattern) String() string { return p.expr }

// Step sources, as a series' notes name them.
const (
	StepLineOrder    = "line order"
	StepField        = "the step/iter field"
	StepEpochBatch   = "epoch and N/M batch position"
	StepEpoch        = "the epoch field"
	StepPatternGroup = "the pattern's step group"
)

// LineReader extracts the metric from the lines of a plain-text training
// log, one line at a time: with a Pattern, or else the forms scripts
// print by themselves (`loss 7.89`, `loss=7.89`, `Loss: 7.89`,
// `'loss': 7.89`, `train_loss=…`, `1.2e-3`, `nan`, `inf`). The step comes
// from the pattern's step group or a `step N`/`iter N` field, else from
// `epoch E` with a `N/M` batch position, else `epoch E`, else the line's
// place among the metric lines. Which one is fixed by the first metric
// line, so a log's steps all mean the same thing. It keeps state; the
// agent holds one per run attempt.
type LineReader struct {
	pat *Pattern
	key *regexp.Regexp
	// word is what every match of key holds, lower-case ASCII (or ""):
	// a line without it skips the regexp, as most of a job's output
	// lines do (the agent reads every one).
	word   string
	mode   string
	count  int64 // metric lines so far
	base   int64 // the first epoch's number, 0 or 1
	seenEp bool
}

// NewLineReader reads metric (empty: the training loss) with pat, or with
// the built-in forms when pat is nil.
func NewLineReader(metric string, pat *Pattern) *LineReader {
	r := &LineReader{pat: pat}
	switch {
	case pat != nil:
	case metric == "" || metric == "loss":
		r.key = lossKey()
	default:
		r.key = keyRegexp(metric)
		r.word = strings.ToLower(metric)
		if metric == "" || metric == "loss" {
			r.word = "loss"
		}
		if !isASCII(r.word) {
			r.word = "" // left to the regexp's Unicode folding
		}
	}
	return r
}

// StepFrom says where the steps came from (a StepXxx constant); empty
// before the first metric line.
func (r *LineReader) StepFrom() string { return r.mode }

// errNoStep: a metric line lacks the step its log's first one had.
var errNoStep = errors.New("no step on this line")

// Read reads one line. ok is false for a line without the metric. err
// says why a line that has the metric cannot be used.
func (r *LineReader) Read(line []byte) (step int64, value float64, ok bool, err error) {
	if r.pat != nil {
		return r.readPattern(line)
	}
	v, ok := r.value(line)
	if !ok {
		return 0, 0, false, nil
	}
	step, mode, has := lineStep(line)
	if r.mode == "" {
		r.mode = StepLineOrder
		if has {
			r.mode = mode
		}
	}
	r.count++
	switch {
	case r.mode == StepLineOrder:
		return r.count, v, true, nil
	case !has || mode != r.mode:
		return 0, v, false, fmt.Errorf("%w (the log's steps come from %s)", errNoStep, r.mode)
	case mode == StepEpochBatch || mode == StepEpoch:
		return r.epochStep(line, mode), v, true, nil
	}
	return step, v, true, nil
}

func (r *LineReader) readPattern(line []byte) (int64, float64, bool, error) {
	m := r.pat.re.FindSubmatchIndex(line)
	if m == nil || m[2*r.pat.value] < 0 {
		return 0, 0, false, nil
	}
	raw := string(bytes.TrimSpace(line[m[2*r.pat.value]:m[2*r.pat.value+1]]))
	v, err := parseValue(raw)
	if err != nil {
		return 0, 0, false, err
	}
	r.count++
	hasStep := r.pat.step >= 0 && m[2*r.pat.step] >= 0
	if r.mode == "" {
		r.mode = StepLineOrder
		if hasStep {
			r.mode = StepPatternGroup
		}
	}
	if r.mode == StepLineOrder {
		return r.count, v, true, nil
	}
	if !hasStep {
		return 0, v, false, fmt.Errorf("%w (the log's steps come from %s)", errNoStep, r.mode)
	}
	raw = string(bytes.TrimSpace(line[m[2*r.pat.step]:m[2*r.pat.step+1]]))
	s, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || s > MaxStep || s < -MaxStep {
		return 0, v, false, fmt.Errorf("step %q is not an integer (|step| ≤ 2^53)", raw)
	}
	return s, v, true, nil
}

func parseValue(raw string) (float64, error) {
	v, err := strconv.ParseFloat(raw, 64)
	if err != nil {
		return 0, fmt.Errorf("value %q is not a number", raw)
	}
	return v, nil
}

// num is a printed float: 7.89, 1.2e-3, .5, nan, inf, -inf, Python's
// and C's spellings.
const num = `[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|[nN][aA][nN]|[iI][nN][fF](?:[iI][nN][iI][tT][yY])?)`

// keyRegexp matches `KEY 7.89`, `KEY=7.89`, `KEY: 7.89`, `'KEY': 7.89`
// and `"KEY": 7.89`. The key must not continue a longer word on the left
// (val_loss, eval_loss) or the right (loss_scale); for the loss,
// train_loss, training_loss, train/loss and "train loss" count too.
func keyRegexp(metric string) *regexp.Regexp {
	key := regexp.QuoteMeta(metric)
	if metric == "" || metric == "loss" {
		// Lightning prints train_loss_step and train_loss_epoch for
		// self.log(..., on_step=True, on_epoch=True).
		key = `(?:train(?:ing)?[_/ ]?)?loss(?:_step)?`
	}
	return regexp.MustCompile(`(?i)(?:^|[^a-z0-9_./])['"]?(` + key + `)['"]?(?:\s*[:=]\s*|\s+)(` + num + `)(?:[^a-z0-9_.]|$)`)
}

// lossKey is keyRegexp("loss"), compiled once: the agent makes a
// LineReader per run attempt, compare and ReadFile one per file.
//
// This file's expressions are compiled on first use (sync.OnceValue),
// not at package initialisation: every binary links this package (spec
// checks metrics.pattern with CompilePattern), and a command that reads
// no text log, `gpupass validate` first, should not pay for them.
var lossKey = sync.OnceValue(func() *regexp.Regexp { return keyRegexp("loss") })

// heldOut says the text before a key names held-out data, whose loss is
// not the training loss: `valid loss`, `test loss`, and within two words,
// as PyTorch's mnist example prints `Test set: Average loss: 0.1004`.
var heldOut = sync.OnceValue(func() *regexp.Regexp {
	return regexp.MustCompile(`(?i)(?:^|[^a-z0-9])(?:val|valid|validation|eval|evaluation|test)(?:[^a-z0-9|]+[a-z]+){0,2}[^a-z0-9|]*$`)
})

// summary marks Hugging Face Trainer's end-of-training dict, whose
// train_loss is the mean over the run, not a step's loss.
var summary = []byte("'train_runtime'")

func (r *LineReader) value(line []byte) (float64, bool) {
	if !containsLower(line, r.word) || bytes.Contains(line, summary) {
		return 0, false
	}
	for off := 0; off < len(line); {
		m := r.key.FindSubmatchIndex(line[off:])
		if m == nil {
			return 0, false
		}
		keyStart := off + m[2]
		if !heldOut().Match(bytes.TrimRight(line[:keyStart], `'" `+"\t")) {
			v, err := parseValue(string(line[off+m[4] : off+m[5]]))
			if err == nil {
				return v, true
			}
		}
		off += m[3]
	}
	return 0, false
}

// containsLower says whether line holds word (lower-case) in any ASCII
// case, as key's (?i) matches it; key also folds the Kelvin sign and the
// long s (ſ) to k and s, which no training log spells a metric with.
func containsLower(line []byte, word string) bool {
	n := len(word)
next:
	for i := 0; i+n <= len(line); i++ {
		for j := 0; j < n; j++ {
			c := line[i+j]
			if 'A' <= c && c <= 'Z' {
				c += 'a' - 'A'
			}
			if c != word[j] {
				continue next
			}
		}
		return true
	}
	return false
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}

var (
	stepField = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)(?:^|[^a-z0-9_])['"]?(?:global_step|step|iter|iteration)['"]?\s*[:=]?\s*(\d+)(?:[^\d.]|\.\D|\.$|$)`)
	})
	epochField = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)(?:^|[^a-z0-9_])['"]?epoch['"]?\s*[:=]?\s*(\d+)(?:[^\d.]|\.\D|\.$|$)`)
	})
	// A batch position: `50/ 544 batches`, `batch 50/544`, `[640/60000`,
	// a progress bar's `| 50/100 [`.
	batchPos = sync.OnceValue(func() *regexp.Regexp {
		return regexp.MustCompile(`(?i)(?:batch(?:es)?\s*[:=]?\s*|\[\s*|\|\s*)(\d+)\s*/\s*(\d+)|(\d+)\s*/\s*(\d+)\s*batch`)
	})
)

// lineStep finds the step of a line and says where it came from.
func lineStep(line []byte) (int64, string, bool) {
	if m := stepField().FindSubmatch(line); m != nil {
		if s, err := strconv.ParseInt(string(m[1]), 10, 64); err == nil && s <= MaxStep {
			return s, StepField, true
		}
	}
	if epochField().Match(line) {
		if batchPos().Match(line) {
			return 0, StepEpochBatch, true
		}
		return 0, StepEpoch, true
	}
	return 0, "", false
}

// epochStep numbers a line by its epoch (and batch position): with M
// batches an epoch, batch N of epoch E is step (E-base)·M + N, base
// being the log's first epoch number when that is 0 or 1.
func (r *LineReader) epochStep(line []byte, mode string) int64 {
	em := epochField().FindSubmatch(line)
	e, _ := strconv.ParseInt(string(em[1]), 10, 64)
	if !r.seenEp {
		r.seenEp, r.base = true, min(e, 1)
	}
	e = min(max(e-r.base, 0), MaxStep)
	if mode == StepEpoch {
		return e
	}
	bm := batchPos().FindSubmatch(line)
	n, m := bm[1], bm[2]
	if len(n) == 0 {
		n, m = bm[3], bm[4]
	}
	ni, _ := strconv.ParseInt(string(n), 10, 64)
	mi, _ := strconv.ParseInt(string(m), 10, 64)
	if ni > MaxStep || (mi > 0 && e > 0 && e > (MaxStep-ni)/mi) {
		return MaxStep
	}
	return e*mi + ni
}

// ReadTextLog reads a plain-text training log: every line (and every
// carriage-return update of a progress bar) that has the metric is a
// point. Lines without it are ordinary output, not problems. The series'
// notes say how many lines were read and had the metric, and where the
// steps came from.
func ReadTextLog(r io.Reader, source string, opt Options) (*Series, error) {
	metric := opt.Metric
	if metric == "" {
		metric = "loss"
	}
	s := &Series{Source: source, Metric: metric, Format: "text"}
	lr := NewLineReader(opt.Metric, opt.Pattern)
	ln := newLines(r)
	updates := 0 // progress-bar updates after a carriage return
	for {
		line, where, err := ln.read(source, &s.Problems)
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		segs := bytes.Split(line, []byte("\r"))
		updates += len(segs) - 1
		for _, seg := range segs {
			step, v, ok, perr := lr.Read(seg)
			if perr != nil {
				s.Problems.Add(where.String(), perr.Error())
				continue
			}
			if ok {
				s.Points = append(s.Points, Point{Step: step, Value: v})
			}
		}
	}
	how := fmt.Sprintf(`the built-in forms ("%[1]s 1.23", "%[1]s=1.23", "%[1]s: 1.23", "'%[1]s': 1.23")`, metric)
	if opt.Pattern != nil {
		how = "the metric pattern '" + opt.Pattern.String() + "'"
	}
	read := fmt.Sprintf("%d line(s)", ln.n)
	if updates > 0 {
		read = fmt.Sprintf("%d line(s) and %d progress-bar update(s)", ln.n, updates)
	}
	if len(s.Points) == 0 {
		return nil, &EmptyError{Source: source, Metric: metric, Problems: s.Problems,
			Read: fmt.Sprintf("read %s as a text log with %s: none had a value", read, how)}
	}
	s.Notes = append(s.Notes, fmt.Sprintf("read as a text log: %d of %s had %s by %s; step: %s",
		len(s.Points), read, metric, how, lr.StepFrom()))
	s.Normalize()
	return s, nil
}
