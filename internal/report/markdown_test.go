package report

import (
	"bytes"
	"encoding/csv"
	"math"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/metrics"
)

// The report is posted as a PR comment / MR note, and metric names, labels
// and notes come from the job's own output. These tests hold that none of
// them can add markup to the comment, and that a reader still sees them as
// they were.

const asciiPunct = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"

// codeSpan parses the code span at the start of s as CommonMark does: the
// opening backtick run closes at the next run of exactly its length, and
// the content loses one space each side when it has both and is not all
// spaces.
func codeSpan(s string) (content, rest string, ok bool) {
	n := len(s) - len(strings.TrimLeft(s, "`"))
	if n == 0 {
		return "", s, false
	}
	for i := n; i < len(s); {
		if s[i] != '`' {
			i++
			continue
		}
		j := i
		for j < len(s) && s[j] == '`' {
			j++
		}
		if j-i == n {
			c := s[n:i]
			if len(c) >= 2 && c[0] == ' ' && c[len(c)-1] == ' ' && strings.Trim(c, " ") != "" {
				c = c[1 : len(c)-1]
			}
			return c, s[j:], true
		}
		i = j
	}
	return "", s, false
}

// plain is the text a reader sees: backslash escapes and zero-width spaces
// gone.
func plain(md string) string {
	var b strings.Builder
	for i := 0; i < len(md); i++ {
		if md[i] == '\\' && i+1 < len(md) && strings.IndexByte(asciiPunct, md[i+1]) >= 0 {
			i++
		}
		b.WriteByte(md[i])
	}
	return strings.ReplaceAll(b.String(), "\u200b", "")
}

var listStart = regexp.MustCompile(`^(\d{1,9}[.)]|[-+*>#])`)

// active lists what in md, a piece of text from one value, a markdown or
// HTML renderer or a forge's mention and reference matcher would act on.
func active(md string) []string {
	var out []string
	if m := listStart.FindString(md); m != "" {
		out = append(out, "block "+m)
	}
	for i := 0; i < len(md); i++ {
		c := md[i]
		switch {
		case c == '\\' && i+1 < len(md) && strings.IndexByte(asciiPunct, md[i+1]) >= 0:
			i++
			if md[i] == '#' && !strings.HasPrefix(md[i+1:], "\u200b") {
				out = append(out, "reference #")
			}
		case c == '@' && !strings.HasPrefix(md[i+1:], "\u200b"):
			out = append(out, "mention @")
		case strings.IndexByte("\\`*_[]<>!~&$%|#", c) >= 0:
			out = append(out, string(c))
		}
	}
	return out
}

// cells splits a table row on the pipes GFM splits it on.
func cells(row string) []string {
	var out []string
	start := 0
	for i := 0; i < len(row); i++ {
		switch row[i] {
		case '\\':
			i++
		case '|':
			out = append(out, strings.TrimSpace(row[start:i]))
			start = i + 1
		}
	}
	out = append(out, strings.TrimSpace(row[start:]))
	return out[1 : len(out)-1]
}

func TestMarkdownMetricCodeSpan(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, metric string
		csv          bool // read from a CSV header, as the job wrote it
	}{
		{"backticks break out", "train_loss` **[✅ consistent](https://evil.example)** @octo-org/security `", true},
		{"runs of backticks", "a``b` **x**", false},
		{"leading backtick", "`loss", false},
		{"trailing backtick", "loss`", false},
		{"spaces kept", " loss ", false},
		{"no HTML escaping inside", "a<b &lt; c", false},
		{"line breaks", "loss\r```\n# owned", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var series []*metrics.Series
			for _, label := range []string{"us", "eu"} {
				s := curve(label, 10, 20, 0)
				s.Metric = tc.metric
				if tc.csv {
					var err error
					s, err = metrics.ReadCSV(strings.NewReader("step,"+tc.metric+"\n0,2.0\n1,1.5\n"), label+"/metrics.csv", metrics.Options{})
					if err != nil {
						t.Fatal(err)
					}
					s.Label = label
				}
				series = append(series, s)
			}
			r, err := Build(series, DefaultTolerance)
			if err != nil {
				t.Fatal(err)
			}
			var md bytes.Buffer
			if err := Markdown(&md, r); err != nil {
				t.Fatal(err)
			}
			var line string
			for _, l := range strings.Split(md.String(), "\n") {
				if after, ok := strings.CutPrefix(l, "Metric "); ok {
					line = after
				}
			}
			content, rest, ok := codeSpan(line)
			if !ok || !strings.HasPrefix(rest, ", 2 run(s),") {
				t.Fatalf("metric not one code span: %q", line)
			}
			want := strings.NewReplacer("\r", " ", "\n", " ").Replace(tc.metric)
			if d := cmp.Diff(want, content); d != "" {
				t.Errorf("code span content (-want +got):\n%s", d)
			}
			_, chart, _ := strings.Cut(md.String(), "```mermaid\n")
			if chart, _, _ = strings.Cut(chart, "\n```\n"); strings.Count(chart, "\n") != 6 || strings.Contains(chart, "\r") {
				t.Errorf("metric changed the Mermaid block's lines:\n%s", chart)
			}
		})
	}
}

func TestMarkdownUntrustedTextIsInert(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, value string }{
		{"mention", "@octo-org/security please look"},
		{"link", "[✅ consistent](https://evil.example)"},
		{"image and HTML", "![ok](https://evil.example/a.png) <img src=x onerror=alert(1)>"},
		{"emphasis and entity", "**all good** &#64;admin"},
		{"pipe and newline", "a|b\n- [x](y) ~~c~~"},
		{"ordered list", "1. @team"},
		{"bullet list", "+ @team"},
		{"heading and issue reference", "# see #123"},
		{"math and html comment", "$\\color{red}x$ <!-- -->"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// The value is a label, a note, and a bad loss value quoted in
			// a note, as metrics.ReadCSV reports it.
			var in bytes.Buffer
			w := csv.NewWriter(&in)
			w.WriteAll([][]string{{"step", "train_loss"}, {"0", "2.0"}, {"1", tc.value}, {"2", "1.5"}})
			a, err := metrics.ReadCSV(&in, "us/metrics.csv", metrics.Options{})
			if err != nil {
				t.Fatal(err)
			}
			a.Label = tc.value
			a.Notes = append(a.Notes, tc.value)
			b := curve("eu", 1, 2, 0)
			r, err := Build([]*metrics.Series{a, b}, DefaultTolerance)
			if err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			if err := Markdown(&out, r); err != nil {
				t.Fatal(err)
			}
			md := out.String()
			want := strings.ReplaceAll(tc.value, "\n", " ")

			// Each piece of text that carries the value, and the text a
			// reader sees there.
			type piece struct{ where, md, reader string }
			var pieces []piece
			section := ""
			for _, l := range strings.Split(md, "\n") {
				switch {
				case strings.HasPrefix(l, "#### "):
					section = l
				case strings.HasPrefix(l, "<details>"):
					section = "notes"
				case strings.HasPrefix(l, "Lines: 🔵 "):
					first, _, _ := strings.Cut(strings.TrimPrefix(l, "Lines: 🔵 "), " · ")
					pieces = append(pieces, piece{"legend", first, want})
				case section == "#### Runs" && strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| run "):
					c := cells(l)
					if len(c) != 10 {
						t.Errorf("runs row has %d cells, want 10: %s", len(c), l)
						continue
					}
					if c[1] == "eu.jsonl" {
						continue
					}
					pieces = append(pieces, piece{"run cell", c[0], want})
				case section == "#### Pairs" && strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| pair "):
					c := cells(l)
					if len(c) != 6 {
						t.Errorf("pairs row has %d cells, want 6: %s", len(c), l)
						continue
					}
					pieces = append(pieces, piece{"pair cell", c[0], want + " vs eu"})
				case section == "notes" && l != "" && l != "</details>":
					n, ok := strings.CutPrefix(l, "- ")
					if !ok {
						t.Errorf("note line is not a list item: %q", l)
						continue
					}
					if strings.HasPrefix(plain(n), want) {
						pieces = append(pieces, piece{"note", n, plain(n)})
					}
				}
			}
			if len(pieces) != 6 { // legend, run, pair, 3 notes (problem, note, pair note)
				t.Fatalf("value found in %d places, want 6:\n%s", len(pieces), md)
			}
			for _, p := range pieces {
				if got := active(p.md); len(got) > 0 {
					t.Errorf("%s %q: active markup %q", p.where, p.md, got)
				}
				if !strings.HasPrefix(plain(p.md), want) || plain(p.md) != p.reader {
					t.Errorf("%s shows %q, want %q", p.where, plain(p.md), p.reader)
				}
			}
		})
	}
}

// mermaidBlock is the xychart in md: its x-axis labels, y-axis bounds and
// lines as written, and the line of text under it.
type mermaidBlock struct {
	steps []string // a category axis's labels
	// A numeric x axis's range ("" with a category axis).
	xlo, xhi string
	lo, hi   string
	lines    [][]string
	under    string
}

// markdownOf is the markdown report of series under the default
// tolerance.
func markdownOf(t *testing.T, series []*metrics.Series) string {
	t.Helper()
	r, err := Build(series, DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Markdown(&out, r); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func parseMermaid(t *testing.T, md string) mermaidBlock {
	t.Helper()
	_, rest, ok := strings.Cut(md, "```mermaid\n")
	if !ok {
		t.Fatalf("no Mermaid block:\n%s", md)
	}
	block, after, _ := strings.Cut(rest, "```\n")
	var m mermaidBlock
	list := func(s string) []string {
		s = strings.TrimSuffix(strings.TrimPrefix(s, "["), "]")
		return strings.Split(s, ", ")
	}
	for _, l := range strings.Split(block, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.HasPrefix(l, `x-axis "step" [`):
			m.steps = list(strings.TrimPrefix(l, `x-axis "step" `))
		case strings.HasPrefix(l, `x-axis "step" `):
			f := strings.Fields(l)
			if len(f) != 5 || f[3] != "-->" {
				t.Fatalf("x-axis line: %q", l)
			}
			m.xlo, m.xhi = f[2], f[4]
		case strings.HasPrefix(l, "y-axis "):
			f := strings.Fields(l)
			if len(f) != 5 || f[3] != "-->" {
				t.Fatalf("y-axis line: %q", l)
			}
			m.lo, m.hi = f[2], f[4]
		case strings.HasPrefix(l, "line "):
			m.lines = append(m.lines, list(strings.TrimPrefix(l, "line ")))
		}
	}
	m.under = strings.TrimSpace(after)
	m.under, _, _ = strings.Cut(m.under, "\n")
	return m
}

// mermaidNumber is what Mermaid's xychart lexer takes as a number: no
// exponent, no Inf or NaN.
var everyNth = regexp.MustCompile(`every (\d+)(?:st|nd|rd|th) logged step`)

var mermaidNumber = regexp.MustCompile(`^[+-]?(?:\d+(?:\.\d+)?|\.\d+)$`)

func TestMermaidDrawsLoggedSteps(t *testing.T) {
	t.Parallel()
	// Two regions logging every step from 1 to 200: step 1's loss 0.756
	// falls fast, as in the report that opened issue #36.
	loss := func(label string, offset float64) *metrics.Series {
		s := &metrics.Series{Label: label, Source: label + ".jsonl", Metric: "loss", Format: "jsonl"}
		for st := int64(1); st <= 200; st++ {
			v := 0.756
			if st > 1 {
				v = 0.05 + 0.5/float64(st) + offset
			}
			s.Points = append(s.Points, metrics.Point{Step: st, Value: v})
		}
		return s
	}
	series := []*metrics.Series{loss("us-west-2", 0), loss("eu-central-1", 0.001)}
	r, err := Build(series, DefaultTolerance)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := Markdown(&out, r); err != nil {
		t.Fatal(err)
	}
	md := out.String()
	m := parseMermaid(t, md)
	if len(m.lines) != len(series) || len(m.lines[0]) == 0 {
		t.Fatalf("%d lines, want %d", len(m.lines), len(series))
	}

	// Step 1 drawn as logged, on a y axis from 0 out to at least the
	// largest value drawn.
	if m.lines[0][0] != "0.756" {
		t.Errorf("step 1 drawn as %s, logged 0.756", m.lines[0][0])
	}
	var largest float64
	for _, line := range m.lines {
		for _, s := range line {
			if !mermaidNumber.MatchString(s) {
				t.Fatalf("value %q is not a Mermaid number", s)
			}
			v, _ := strconv.ParseFloat(s, 64)
			largest = max(largest, v)
		}
	}
	lo, errLo := strconv.ParseFloat(m.lo, 64)
	hi, errHi := strconv.ParseFloat(m.hi, 64)
	if errLo != nil || errHi != nil {
		t.Fatalf("y-axis %s --> %s", m.lo, m.hi)
	}
	if lo != 0 {
		t.Errorf("y-axis starts at %s, want 0 for a loss with no negative value", m.lo)
	}
	if hi < largest || hi < 0.756 {
		t.Errorf("y-axis ends at %s, below the largest value drawn, %v, or logged, 0.756", m.hi, largest)
	}

	// The lines named as in the runs table, in its order.
	var names []string
	section := ""
	for _, l := range strings.Split(md, "\n") {
		switch {
		case strings.HasPrefix(l, "#### "):
			section = l
		case section == "#### Runs" && strings.HasPrefix(l, "| ") && !strings.HasPrefix(l, "| run "):
			names = append(names, cells(l)[0])
		}
	}
	if d := cmp.Diff([]string{"us-west-2", "eu-central-1"}, names); d != "" {
		t.Fatalf("runs table names (-want +got):\n%s", d)
	}
	legend, _, _ := strings.Cut(strings.TrimPrefix(m.under, "Lines: "), ". Drawn:")
	var drawn []string
	for _, entry := range strings.Split(legend, " · ") {
		_, name, _ := strings.Cut(entry, " ") // after the colour
		drawn = append(drawn, name)
	}
	if !strings.HasPrefix(m.under, "Lines: ") || !cmp.Equal(names, drawn) {
		t.Errorf("text under the chart %q names the lines %q, want the runs table's %q", m.under, drawn, names)
	}

	// The x axis: numeric, from the first step to the last, with a few
	// round labels Mermaid picks (it once listed all 50 points' steps,
	// which ran into one another). Mermaid spreads a line's points
	// evenly over it: each must be the value logged at the step nearest
	// to where it is drawn.
	if m.steps != nil || m.xlo != "1" || m.xhi != "200" {
		t.Fatalf("x axis %v / %s --> %s: want a numeric axis from 1 to 200", m.steps, m.xlo, m.xhi)
	}
	if !strings.Contains(m.under, "points spread evenly from step 1 to 200, each at the logged step nearest to it") {
		t.Errorf("text under the chart does not say how the points are picked: %q", m.under)
	}
	for i, s := range series {
		k := len(m.lines[i])
		if k < 2 || k > MermaidPoints {
			t.Fatalf("line %d has %d values, want 2 to %d", i, k, MermaidPoints)
		}
		for j, drawn := range m.lines[i] {
			at := 1 + 199*float64(j)/float64(k-1) // where Mermaid draws it
			got, _ := strconv.ParseFloat(drawn, 64)
			ok := false
			for _, st := range []int64{int64(math.Floor(at + 0.5)), int64(math.Ceil(at - 0.5))} {
				want, _ := s.ValueAt(st)
				ok = ok || math.Abs(got-want) <= 1e-4*math.Abs(want)
			}
			if !ok {
				want, _ := s.ValueAt(int64(math.Round(at)))
				t.Errorf("%s: point %d, drawn at step %.2f, is %s; logged there %v", s.Label, j, at, drawn, want)
			}
		}
	}
}

// TestMermaidUnevenSteps: steps too uneven to spread over a numeric axis
// are drawn on a category axis of every Nth logged step (N stated under
// the chart), with few enough labels to read.
func TestMermaidUnevenSteps(t *testing.T) {
	t.Parallel()
	var series []*metrics.Series
	for _, label := range []string{"a", "b"} {
		s := &metrics.Series{Label: label, Source: label + ".jsonl", Metric: "loss", Format: "jsonl"}
		// Every step at first, then every 100th: a numeric axis would
		// draw the early steps far from where they were logged.
		for st := int64(1); st <= 2000; st++ {
			if st <= 60 || st%100 == 0 {
				s.Points = append(s.Points, metrics.Point{Step: st, Value: 1 / float64(st)})
			}
		}
		series = append(series, s)
	}
	m := parseMermaid(t, markdownOf(t, series))
	if m.xlo != "" || len(m.steps) < 2 || m.steps[0] != "1" || m.steps[len(m.steps)-1] != "2000" {
		t.Fatalf("x axis %v / %s --> %s: want the real steps, from 1 to 2000", m.steps, m.xlo, m.xhi)
	}
	if len(m.steps) > MermaidLabels {
		t.Errorf("%d step labels, want at most %d", len(m.steps), MermaidLabels)
	}
	n, err := strconv.Atoi(m.steps[1])
	if err != nil {
		t.Fatal(err)
	}
	n--
	if said := everyNth.FindStringSubmatch(m.under); said == nil || said[1] != strconv.Itoa(n) {
		t.Errorf("text under the chart does not say every %dth logged step is drawn: %q", n, m.under)
	}
	for i, s := range series {
		for j, label := range m.steps {
			st, err := strconv.ParseInt(label, 10, 64)
			if err != nil {
				t.Fatalf("x-axis label %q is not a step", label)
			}
			want, _ := s.ValueAt(st)
			got, _ := strconv.ParseFloat(m.lines[i][j], 64)
			if math.Abs(got-want) > 1e-4*math.Abs(want) {
				t.Errorf("%s at step %d drawn as %s, logged %v", s.Label, st, m.lines[i][j], want)
			}
		}
	}
}

func TestMermaidYAxis(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		values []float64
	}{
		{"loss", []float64{0.756, 0.5, 0.49, 0.486}},
		{"all zero", []float64{0, 0, 0}},
		{"negative", []float64{-3.2, -1.1, -0.4}},
		{"both signs", []float64{-0.2, 0.3, 1.7}},
		{"tiny range far from zero", []float64{-1000.1, -1000.04, -1000}},
		{"small values", []float64{3e-5, 2e-5, 1.5e-5}},
		{"large values", []float64{4.2e21, 3e21}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var runs []*metrics.Series
			for _, label := range []string{"a", "b"} {
				s := &metrics.Series{Label: label, Source: label, Metric: "loss"}
				for i, v := range tc.values {
					s.Points = append(s.Points, metrics.Point{Step: int64(i), Value: v})
				}
				runs = append(runs, s)
			}
			m := parseMermaid(t, markdownOf(t, runs))
			for _, s := range []string{m.lo, m.hi} {
				if !mermaidNumber.MatchString(s) {
					t.Fatalf("y-axis %s --> %s: %q is not a Mermaid number", m.lo, m.hi, s)
				}
			}
			lo, _ := strconv.ParseFloat(m.lo, 64)
			hi, _ := strconv.ParseFloat(m.hi, 64)
			least, most := math.Inf(1), math.Inf(-1)
			for _, line := range m.lines {
				for _, s := range line {
					if !mermaidNumber.MatchString(s) {
						t.Fatalf("value %q is not a Mermaid number", s)
					}
					v, _ := strconv.ParseFloat(s, 64)
					least, most = min(least, v), max(most, v)
				}
			}
			if lo > least || hi < most || lo >= hi {
				t.Errorf("y-axis %s --> %s does not hold the values drawn, %v..%v", m.lo, m.hi, least, most)
			}
			if least >= 0 && lo != 0 {
				t.Errorf("y-axis starts at %s, want 0: no value is negative", m.lo)
			}
		})
	}
}

// TestMarkdownLinks holds the links line to what a reader can follow
// back: only http(s) URLs, and none of a value's characters can close
// the link early or start markup after it.
func TestMarkdownLinks(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		links []Link
		want  string // the links line; empty: none
	}{
		{"none", nil, ""},
		{"ci run and dashboard", []Link{
			{"CI run", "https://github.example.com/o/r/actions/runs/42/attempts/2"},
			{"run us-west-2", "https://dash.example.com/ui/runs/alloc-1"},
		}, "**Links:** [CI run](https://github.example.com/o/r/actions/runs/42/attempts/2) · [run us-west-2](https://dash.example.com/ui/runs/alloc-1)"},
		{"parenthesis and brackets are encoded", []Link{
			{"CI run", "https://ci.example.com/a) [pwned](https://evil.example/x"},
		}, "**Links:** [CI run](https://ci.example.com/a%29%20%5Bpwned%5D%28https://evil.example/x)"},
		{"a line break drops the link", []Link{
			{"CI run", "https://ci.example.com/a\n# heading @team"},
		}, ""},
		{"not http", []Link{
			{"CI run", "javascript:alert(1)"}, {"artifacts", "/relative/path"}, {"x", "ftp://files.example.com/a"},
		}, ""},
		{"hostile label", []Link{
			{"run ](https://evil.example) @team", "https://dash.example.com/ui/runs/a"},
		}, "**Links:** [run \\](https://evil.example) @" + zwsp + "team](https://dash.example.com/ui/runs/a)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r, err := Build([]*metrics.Series{curve("us", 1, 5, 0), curve("eu", 1, 5, 0)}, DefaultTolerance)
			if err != nil {
				t.Fatal(err)
			}
			r.Links = tc.links
			var out bytes.Buffer
			if err := Markdown(&out, r); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "**Links") || strings.Contains(l, "evil") || strings.Contains(l, "heading") {
					got = append(got, l)
				}
			}
			var want []string
			if tc.want != "" {
				want = []string{tc.want}
			}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("links lines (-want +got):\n%s", diff)
			}
			// Above the tables: a comment cut to the forge's limit keeps it.
			if tc.want != "" && strings.Index(out.String(), tc.want) > strings.Index(out.String(), "#### Runs") {
				t.Errorf("the links line comes after the runs table:\n%s", out.String())
			}
		})
	}
}

// LinkURL without net/url (report is pure): what url.Parse refused or
// the check of its scheme and host turned away stays out.
func TestLinkURL(t *testing.T) {
	t.Parallel()
	for s, want := range map[string]bool{
		"https://ci.example.com/o/r/actions/runs/1": true,
		"HTTP://ci.example.com":                     true,
		"https://u:p@ci.example.com/x":              true,
		"https://":                                  false,
		"https:///x":                                false,
		"https://u@/x":                              false,
		"ftp://ci.example.com":                      false,
		"javascript:alert(1)":                       false,
		"//ci.example.com/x":                        false,
		"https://ci.example.com/\n# heading":        false,
		"https://ci.example.com/\x7f":               false,
	} {
		if _, ok := LinkURL(s); ok != want {
			t.Errorf("LinkURL(%q): %v, want %v", s, ok, want)
		}
	}
}
