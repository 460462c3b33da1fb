package report

import (
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/clipperhouse/displaywidth"
)

// palette fixes the Mermaid line colours so the legend can name them.
var palette = []struct{ hex, dot string }{
	{"#1f77b4", "🔵"}, {"#ff7f0e", "🟠"}, {"#2ca02c", "🟢"}, {"#d62728", "🔴"},
	{"#9467bd", "🟣"}, {"#8c564b", "🟤"}, {"#111111", "⚫"}, {"#bcbd22", "🟡"},
}

// Markdown writes the report as GitHub/GitLab flavoured markdown: verdict,
// tables of run and pair figures, a Mermaid xychart and notes.
func Markdown(w io.Writer, r *Report) error {
	var b bytes.Buffer
	icon := map[string]string{Consistent: "✅", Diverged: "❌", Inconclusive: "⚠️", InProgress: "⏳"}[r.Verdict]
	fmt.Fprintf(&b, "### %s gpupass compare: %s\n\n", icon, r.Verdict)
	progress := r.Verdict == InProgress
	if progress {
		fmt.Fprintf(&b, "**Not a verdict yet:** %d of %d run(s) have not ended. The figures are those logged so far; this report is replaced by the verdict once every run has ended.\n\n", r.Running(), len(r.Runs))
	}
	if r.Simulated {
		b.WriteString("> **Simulated**: figures derive from a simulated hardware profile.\n\n")
	}
	for _, run := range r.Runs {
		if run.Disputed != "" {
			fmt.Fprintf(&b, "> **Log disputed** (%s): %s\n\n", mdText(run.Label), mdText(run.Disputed))
		}
	}
	if progress {
		fmt.Fprintf(&b, "Metric %s, %d run(s); once they have ended, compared at tolerance %s at every common step.\n\n", mdCode(r.Metric), len(r.Runs), r.Tolerance)
	} else {
		fmt.Fprintf(&b, "Metric %s, %d run(s), tolerance %s at every common step.\n\n", mdCode(r.Metric), len(r.Runs), r.Tolerance)
	}
	// Near the top: a comment too long for the forge is cut at the end
	// (forge.Truncate), and the way back should survive the cut.
	if links := mdLinks(r.Links); links != "" {
		b.WriteString(links + "\n\n")
	}

	if progress {
		if err := progressTable(&b, r); err != nil {
			return err
		}
	} else if err := runsTable(&b, r); err != nil {
		return err
	}
	if len(r.Pairs) > 0 {
		pairs := [][]string{}
		for _, p := range r.Pairs {
			if p.Error != "" {
				pairs = append(pairs, []string{mdText(p.Label()), "0", NA, NA, NA, "⚠️ " + mdText(p.Error)})
				continue
			}
			first := "none"
			if p.FirstDivergence != nil {
				first = "step " + strconv.FormatInt(*p.FirstDivergence, 10)
			}
			verdict := "✅ within tolerance"
			switch {
			case len(p.Disputed) > 0:
				verdict = "⚠️ log disputed: " + mdText(strings.Join(p.Disputed, ", "))
			case p.Verdict == Diverged:
				verdict = "❌ diverged"
			}
			pairs = append(pairs, []string{mdText(p.Label()), strconv.Itoa(p.CommonSteps), p.MaxAbsDeltaText(), p.RelFinalDiffText(), first, verdict})
		}
		b.WriteString("\n#### Pairs\n\n")
		if err := table(&b, []string{"pair", "common steps", "max abs Δ", "rel final diff", "first divergence", "verdict"}, pairs); err != nil {
			return err
		}
	}
	if c := r.Chart; c != nil && len(r.Runs) > 0 {
		b.WriteString("\n")
		mermaid(&b, c, r.Metric)
	}
	notes := notesOf(r)
	if len(notes) > 0 {
		b.WriteString("\n<details><summary>Notes</summary>\n\n")
		for _, n := range notes {
			b.WriteString("- " + mdText(n) + "\n")
		}
		b.WriteString("\n</details>\n")
	}
	_, err := w.Write(b.Bytes())
	return err
}

// runsTable writes the figures of the runs of a verdict.
func runsTable(b *bytes.Buffer, r *Report) error {
	runs := [][]string{}
	for _, run := range r.Runs {
		minCell := Num(float64(run.MinLoss))
		if finite(float64(run.MinLoss)) {
			minCell += " (step " + strconv.FormatInt(run.MinStep, 10) + ")"
		}
		source := run.Source
		if run.Slurm != nil {
			source += ", " + run.Slurm.String()
		}
		runs = append(runs, []string{
			mdText(run.Label), mdText(source), Num(float64(run.FinalLoss)), minCell,
			fmt.Sprintf("%d..%d (%d pts)", run.FirstStep, run.LastStep, run.Points),
			Duration(run.WallSeconds), Throughput(run.StepsPerSecond), Duration(run.TimeToFirstStep),
			Cost(run.CostUSD), strconv.Itoa(run.Restarts),
		})
	}
	b.WriteString("#### Runs\n\n")
	return table(b, []string{"run", "source", "final loss", "min loss", "steps", "wall time", "steps/s", "time to first step", "cost", "restarts"}, runs)
}

// progressTable writes where each run of an in-progress report stands:
// its state, and its last step and loss so far.
func progressTable(b *bytes.Buffer, r *Report) error {
	runs := [][]string{}
	for _, run := range r.Runs {
		state := run.State
		if state == "" {
			state = "ended" // a file: all there is
		}
		if run.Running {
			state = "⏳ " + mdText(state)
		} else {
			state = mdText(state)
		}
		last, lastLoss, minCell := NA, NA, NA
		if run.Points > 0 {
			last = strconv.FormatInt(run.LastStep, 10)
			lastLoss = Num(float64(run.FinalLoss))
			minCell = Num(float64(run.MinLoss))
			if finite(float64(run.MinLoss)) {
				minCell += " (step " + strconv.FormatInt(run.MinStep, 10) + ")"
			}
		}
		runs = append(runs, []string{
			mdText(run.Label), state, mdText(run.Source), last, lastLoss, minCell, strconv.Itoa(run.Points),
			Duration(run.WallSeconds), Throughput(run.StepsPerSecond), Cost(run.CostUSD), strconv.Itoa(run.Restarts),
		})
	}
	b.WriteString("#### Runs so far\n\n")
	return table(b, []string{"run", "state", "source", "last step", "last loss", "min loss", "points", "wall time", "steps/s", "cost so far", "restarts"}, runs)
}

// notesOf gathers what a reader should know: input problems, NaN/Inf,
// normalisation and alignment notes.
func notesOf(r *Report) []string {
	var out []string
	for _, run := range r.Runs {
		if run.Problems.Count > 0 {
			out = append(out, fmt.Sprintf("%s: skipped %s", run.Label, run.Problems))
		}
		if run.NonFinite > 0 {
			out = append(out, fmt.Sprintf("%s: %d NaN/Inf value(s) in the run (kept; they fail every tolerance check)", run.Label, run.NonFinite))
		}
		for _, n := range run.Notes {
			out = append(out, run.Label+": "+n)
		}
		if run.Points == 1 {
			out = append(out, run.Label+": a single point: no curve, no throughput")
		}
	}
	for _, p := range r.Pairs {
		if p.Note != "" {
			out = append(out, p.Label()+": "+p.Note)
		}
		if p.NonFiniteSteps > 0 {
			out = append(out, fmt.Sprintf("%s: %d common step(s) with NaN/Inf", p.Label(), p.NonFiniteSteps))
		}
	}
	if r.Chart != nil && len(r.Chart.Dropped) > 0 {
		out = append(out, "chart: no finite values to draw for "+strings.Join(r.Chart.Dropped, ", "))
	}
	if r.Chart != nil {
		for _, l := range r.Chart.Lines {
			if l.Between > 0 {
				out = append(out, fmt.Sprintf("chart: %s logged no value at %d of the %d steps drawn; drawn there on the line between its neighbouring points", l.Label, l.Between, len(r.Chart.Steps)))
			}
		}
	}
	if r.Chart != nil && r.Chart.Held > 0 {
		out = append(out, fmt.Sprintf("chart: %d point(s) without a finite value drawn at the previous value", r.Chart.Held))
	}
	return append(out, r.Notes...)
}

// mermaid writes the chart as a Mermaid xychart with the real steps drawn
// on its x axis, and under it, as xychart-beta draws no legend, which
// line is which run (named and ordered as in the runs table) and which
// steps are drawn.
func mermaid(b *bytes.Buffer, c *Chart, metric string) {
	colours := make([]string, 0, len(c.Lines))
	legend := make([]string, 0, len(c.Lines))
	for i, l := range c.Lines {
		p := palette[i%len(palette)]
		colours = append(colours, p.hex)
		legend = append(legend, p.dot+" "+mdText(l.Label))
	}
	steps := make([]string, len(c.Steps))
	for i, st := range c.Steps {
		steps[i] = strconv.FormatInt(st, 10)
	}
	lo, hi := mermaidYAxis(c.Min, c.Max)
	b.WriteString("```mermaid\n")
	fmt.Fprintf(b, "%%%%{init: {\"themeVariables\": {\"xyChart\": {\"plotColorPalette\": \"%s\"}}}}%%%%\n", strings.Join(colours, ", "))
	b.WriteString("xychart-beta\n")
	fmt.Fprintf(b, "    title \"%s by step\"\n", mermaidText(metric))
	if c.Linear {
		// A numeric axis: xychart-beta spreads the points evenly over
		// it, which is where Linear's steps are, and labels a few round
		// steps rather than every point.
		fmt.Fprintf(b, "    x-axis \"step\" %d --> %d\n", c.Lo, c.Hi)
	} else {
		fmt.Fprintf(b, "    x-axis \"step\" [%s]\n", strings.Join(steps, ", "))
	}
	fmt.Fprintf(b, "    y-axis \"%s\" %s --> %s\n", mermaidText(metric), mermaidNum(lo), mermaidNum(hi))
	for _, l := range c.Lines {
		vals := make([]string, len(l.Values))
		for i, v := range l.Values {
			vals[i] = mermaidNum(v)
		}
		fmt.Fprintf(b, "    line [%s]\n", strings.Join(vals, ", "))
	}
	b.WriteString("```\n\n")
	drawn := fmt.Sprintf("every logged step from %d to %d", c.Lo, c.Hi)
	switch {
	case c.Linear && len(c.Steps) < c.Logged:
		drawn = fmt.Sprintf("%d points spread evenly from step %d to %d, each at the logged step nearest to it", len(c.Steps), c.Lo, c.Hi)
	case c.Every > 1:
		drawn = fmt.Sprintf("every %s logged step from %d to %d, the last included", ordinal(c.Every), c.Lo, c.Hi)
	}
	fmt.Fprintf(b, "Lines: %s. Drawn: %s, values as logged (not averaged).\n", strings.Join(legend, " · "), drawn)
}

// ordinal writes 2 as "2nd", 11 as "11th", 23 as "23rd".
func ordinal(n int) string {
	suffix := "th"
	if n%100 < 11 || n%100 > 13 {
		switch n % 10 {
		case 1:
			suffix = "st"
		case 2:
			suffix = "nd"
		case 3:
			suffix = "rd"
		}
	}
	return strconv.Itoa(n) + suffix
}

// mermaidNum writes v as Mermaid's xychart reads a number: digits with an
// optional sign and decimals, never an exponent.
func mermaidNum(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// mermaidYAxis is the Mermaid chart's y axis for values in [lo, hi]: from
// 0 when no value is negative (a loss is drawn against zero, not against
// its own minimum), out to round bounds at or beyond the values.
func mermaidYAxis(lo, hi float64) (float64, float64) {
	if v := lo; hi == v {
		// One value: room either side of it, or above it from 0.
		d := max(0.05*abs(v), 0.5)
		if finite(v-d) && finite(v+d) {
			lo, hi = v-d, v+d
		}
		if v >= 0 {
			lo = 0
		}
	}
	if lo >= 0 {
		lo = 0
	}
	span := hi - lo
	if !finite(span) {
		// Values near the float64 limits: the values themselves rather
		// than ±Inf.
		return lo, hi
	}
	// A tenth of the span rounded up to 1, 2 or 5 times a power of ten.
	e := int(math.Floor(math.Log10(span / 10)))
	m := int64(1)
	switch f := span / 10 / math.Pow10(e); {
	case f <= 1:
	case f <= 2:
		m = 2
	case f <= 5:
		m = 5
	default:
		e++
	}
	step := float64(m) * math.Pow10(e)
	if !finite(step) || step == 0 || abs(lo)/step > 1e15 || abs(hi)/step > 1e15 {
		return lo, hi
	}
	// k·m·10^e parsed from its decimal, which is what Mermaid reads, and
	// moved a step out where float rounding left it inside the values.
	at := func(k int64) float64 {
		v, err := strconv.ParseFloat(fmt.Sprintf("%de%d", k*m, e), 64)
		if err != nil {
			return math.NaN()
		}
		return v
	}
	top := int64(math.Ceil(hi / step))
	for at(top) < hi {
		top++
	}
	bottom := int64(math.Floor(lo / step))
	for at(bottom) > lo {
		bottom--
	}
	if a, z := at(bottom), at(top); finite(a) && finite(z) {
		return a, z
	}
	return lo, hi
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

// round5 rounds f to five significant digits, as the chart draws values;
// a value that would round past the float64 range stays as it is.
func round5(f float64) float64 {
	v, err := strconv.ParseFloat(strconv.FormatFloat(f, 'g', 5, 64), 64)
	if err != nil || !finite(v) {
		return f
	}
	return v
}

// mermaidText keeps a value inside its quoted Mermaid string and on its
// line: a lone "\r" ends a line for markdown too, and a line of backticks
// after it would close the code block.
func mermaidText(s string) string { return strings.ReplaceAll(oneLine(s), `"`, "'") }

// table renders a GitHub-flavoured markdown table, each column padded to
// its widest cell (display width, so an emoji counts two) and left-aligned.
// Cells are markdown as given: callers pass untrusted values through
// mdText, which also keeps a "|" or newline in a label or path from
// splitting a row. Written here rather than with a table library so that
// the broker's dashboard, which builds reports, links no table renderer.
func table(w io.Writer, header []string, rows [][]string) error {
	widths := make([]int, len(header))
	measure := func(cells []string) error {
		if len(cells) != len(header) {
			return fmt.Errorf("rendering table: a row of %d cells under %d columns", len(cells), len(header))
		}
		for i, c := range cells {
			widths[i] = max(widths[i], displaywidth.String(c))
		}
		return nil
	}
	if err := measure(header); err != nil {
		return err
	}
	for _, row := range rows {
		if err := measure(row); err != nil {
			return err
		}
	}
	var b bytes.Buffer
	line := func(cells []string) {
		for i, c := range cells {
			b.WriteString("| ")
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", widths[i]-displaywidth.String(c)+1))
		}
		b.WriteString("|\n")
	}
	line(header)
	for _, wd := range widths {
		b.WriteString("|:")
		b.WriteString(strings.Repeat("-", wd+1))
	}
	b.WriteString("|\n")
	for _, row := range rows {
		line(row)
	}
	if _, err := w.Write(b.Bytes()); err != nil {
		return fmt.Errorf("rendering table: %w", err)
	}
	return nil
}

// mdText renders an untrusted value (a label, a path, a note quoting job
// output) as inert text in a paragraph, list item or table cell: a reader
// sees the same characters, the forge renders no markup from them.
//
// Line breaks become spaces so a value cannot end a table row or list
// item. ASCII punctuation that markdown, GFM tables, HTML, GitHub math
// ("$") or GitLab references ("!", "~", "%", "&", "$") give a meaning is
// backslash-escaped, as CommonMark allows for any ASCII punctuation.
// GitHub matches mentions and issue references after rendering, where
// "\@" is already "@" and still pings; a zero-width space after "@" and
// "#" breaks the match on both forges and shows nothing.
func mdText(s string) string {
	s = oneLine(s)
	// "-", "+", "1." and "1)" open a list only where a value starts a line,
	// as a note's list item does; "(" and ")" act only after "]", which is
	// escaped. Elsewhere they stay as written, so "us-west-2" and "step(s)"
	// read the same in the markdown file as on the page.
	lead := -1
	if digits := len(s) - len(strings.TrimLeft(s, "0123456789")); digits > 0 && digits < len(s) && (s[digits] == '.' || s[digits] == ')') {
		lead = digits
	} else if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
		lead = 0
	}
	var b strings.Builder
	b.Grow(len(s) + len(s)/4)
	for i, c := range s {
		switch {
		case c == '@':
			b.WriteString("@" + zwsp)
		case c == '#':
			b.WriteString(`\#` + zwsp)
		case i == lead || strings.ContainsRune("\\`*_[]!|<>~&$%", c):
			b.WriteByte('\\')
			b.WriteRune(c)
		default:
			b.WriteRune(c)
		}
	}
	return b.String()
}

// mdLinks renders links as one "Links:" line; a link whose URL is not an
// absolute http(s) URL is left out, so a stray variable shows nothing
// rather than a link somewhere else.
func mdLinks(links []Link) string {
	var parts []string
	for _, l := range links {
		u, ok := LinkURL(l.URL)
		if !ok {
			continue
		}
		parts = append(parts, "["+mdText(l.Label)+"]("+u+")")
	}
	if len(parts) == 0 {
		return ""
	}
	return "**Links:** " + strings.Join(parts, " · ")
}

// LinkURL checks that s is an absolute http(s) URL and returns it as a
// link destination that cannot end early. A control character (a line
// break among them) refuses it, as url.Parse does (report stays pure:
// no net packages), and so does a scheme other than http or https or an
// empty host. Every byte that could close the destination or the link
// ("(", ")", "<", ">", "[", "]", a space, a quote, a backslash, a
// backtick) is percent-encoded, which a browser reads as the same URL.
func LinkURL(s string) (string, bool) {
	rest, ok := "", false
	for _, scheme := range []string{"http://", "https://"} {
		if len(s) > len(scheme) && strings.EqualFold(s[:len(scheme)], scheme) {
			rest, ok = s[len(scheme):], true
		}
	}
	if !ok || strings.IndexFunc(s, func(r rune) bool { return r < ' ' || r == 0x7f }) >= 0 {
		return "", false
	}
	host := rest
	if i := strings.IndexAny(host, "/?#"); i >= 0 {
		host = host[:i]
	}
	if at := strings.LastIndexByte(host, '@'); at >= 0 {
		host = host[at+1:] // after the userinfo
	}
	if host == "" {
		return "", false
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c >= 0x7f || strings.IndexByte("()<>[]\\\"'`|", c) >= 0 {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String(), true
}

// zwsp is ZERO WIDTH SPACE, U+200B.
const zwsp = "\u200b"

// mdCode renders an untrusted value as a code span, shown verbatim: the
// fence is one backtick longer than the longest run of backticks in the
// value, so none of them can close it (CommonMark 6.1). Nothing inside is
// escaped, as a code span would show the escape itself.
func mdCode(s string) string {
	s = oneLine(s)
	longest, run := 0, 0
	for _, c := range s {
		if c != '`' {
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	fence := strings.Repeat("`", longest+1)
	// A value starting or ending with a backtick would merge with the
	// fence; one starting and ending with a space would lose them. A space
	// each side, which CommonMark strips, keeps both as they are.
	if s == "" || s[0] == '`' || s[len(s)-1] == '`' || (s[0] == ' ' && s[len(s)-1] == ' ' && strings.Trim(s, " ") != "") {
		s = " " + s + " "
	}
	return fence + s + fence
}

// oneLine turns line breaks into spaces: markdown has no way to escape
// one inside a table row, list item or code span.
func oneLine(s string) string { return lineBreaks.Replace(s) }

var lineBreaks = strings.NewReplacer("\r\n", " ", "\r", " ", "\n", " ")
