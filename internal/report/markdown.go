package report

import (
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/olekukonko/tablewriter"
	"github.com/olekukonko/tablewriter/renderer"
	"github.com/olekukonko/tablewriter/tw"
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
	icon := map[string]string{Consistent: "✅", Diverged: "❌", Inconclusive: "⚠️"}[r.Verdict]
	fmt.Fprintf(&b, "### %s gpupass compare: %s\n\n", icon, r.Verdict)
	if r.Simulated {
		b.WriteString("> **Simulated**: figures derive from a simulated hardware profile.\n\n")
	}
	fmt.Fprintf(&b, "Metric `%s`, %d run(s), tolerance %s at every common step.\n\n", esc(r.Metric), len(r.Runs), r.Tolerance)

	runs := [][]string{}
	for _, run := range r.Runs {
		minCell := Num(float64(run.MinLoss))
		if finite(float64(run.MinLoss)) {
			minCell += " (step " + strconv.FormatInt(run.MinStep, 10) + ")"
		}
		runs = append(runs, []string{
			run.Label, run.Source, Num(float64(run.FinalLoss)), minCell,
			fmt.Sprintf("%d..%d (%d pts)", run.FirstStep, run.LastStep, run.Points),
			dur(run.WallSeconds), opt(run.StepsPerSecond, "%.3g"), dur(run.TimeToFirstStep),
			opt(run.CostUSD, "$%.2f"), strconv.Itoa(run.Restarts),
		})
	}
	b.WriteString("#### Runs\n\n")
	if err := table(&b, []string{"run", "source", "final loss", "min loss", "steps", "wall time", "steps/s", "time to first step", "cost", "restarts"}, runs); err != nil {
		return err
	}
	if len(r.Pairs) > 0 {
		pairs := [][]string{}
		for _, p := range r.Pairs {
			if p.Error != "" {
				pairs = append(pairs, []string{p.A + " vs " + p.B, "0", "n/a", "n/a", "n/a", "⚠️ " + p.Error})
				continue
			}
			maxCell := Num(float64(p.MaxAbsDelta))
			if finite(float64(p.MaxAbsDelta)) {
				maxCell += " (step " + strconv.FormatInt(p.MaxAbsDeltaStep, 10) + ")"
			}
			first := "none"
			if p.FirstDivergence != nil {
				first = "step " + strconv.FormatInt(*p.FirstDivergence, 10)
			}
			verdict := "✅ within tolerance"
			if p.Verdict == Diverged {
				verdict = "❌ diverged"
			}
			pairs = append(pairs, []string{p.A + " vs " + p.B, strconv.Itoa(p.CommonSteps), maxCell, signedPct(float64(p.RelFinalDiff)), first, verdict})
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
			b.WriteString("- " + esc(n) + "\n")
		}
		b.WriteString("\n</details>\n")
	}
	_, err := w.Write(b.Bytes())
	return err
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
			out = append(out, p.A+" vs "+p.B+": "+p.Note)
		}
		if p.NonFiniteSteps > 0 {
			out = append(out, fmt.Sprintf("%s vs %s: %d common step(s) with NaN/Inf", p.A, p.B, p.NonFiniteSteps))
		}
	}
	if r.Chart != nil && len(r.Chart.Dropped) > 0 {
		out = append(out, "chart: no finite values to draw for "+strings.Join(r.Chart.Dropped, ", "))
	}
	if r.Chart != nil && r.Chart.Held > 0 {
		out = append(out, fmt.Sprintf("chart: %d bucket(s) without a finite value drawn at the previous value", r.Chart.Held))
	}
	return append(out, r.Notes...)
}

func mermaid(b *bytes.Buffer, c *Chart, metric string) {
	colours := make([]string, 0, len(c.Lines))
	legend := make([]string, 0, len(c.Lines))
	for i, l := range c.Lines {
		p := palette[i%len(palette)]
		colours = append(colours, p.hex)
		legend = append(legend, p.dot+" "+esc(l.Label))
	}
	lo, hi := axisRange(c.Min, c.Max)
	b.WriteString("```mermaid\n")
	fmt.Fprintf(b, "%%%%{init: {\"themeVariables\": {\"xyChart\": {\"plotColorPalette\": \"%s\"}}}}%%%%\n", strings.Join(colours, ", "))
	b.WriteString("xychart-beta\n")
	fmt.Fprintf(b, "    title \"%s by step\"\n", mermaidText(metric))
	fmt.Fprintf(b, "    x-axis \"step\" %d --> %d\n", c.Lo, c.Hi)
	fmt.Fprintf(b, "    y-axis \"%s\" %s --> %s\n", mermaidText(metric), Num(lo), Num(hi))
	for _, l := range c.Lines {
		vals := make([]string, len(l.Values))
		for i, v := range l.Values {
			vals[i] = strconv.FormatFloat(v, 'g', 5, 64)
		}
		fmt.Fprintf(b, "    line [%s]\n", strings.Join(vals, ", "))
	}
	b.WriteString("```\n\n")
	b.WriteString(strings.Join(legend, " · ") + "\n")
}

// axisRange pads [lo, hi] by 5% so lines do not sit on the frame.
func axisRange(lo, hi float64) (float64, float64) {
	pad := (hi - lo) * 0.05
	if !finite(pad) || !finite(lo-pad) || !finite(hi+pad) {
		// Values near the float64 limits: no padding rather than ±Inf.
		return lo, hi
	}
	if pad == 0 {
		pad = max(0.05*abs(hi), 0.5)
	}
	return round5(lo - pad), round5(hi + pad)
}

func abs(f float64) float64 {
	if f < 0 {
		return -f
	}
	return f
}

func round5(f float64) float64 {
	v, _ := strconv.ParseFloat(strconv.FormatFloat(f, 'g', 5, 64), 64)
	return v
}

func mermaidText(s string) string { return strings.NewReplacer(`"`, "'", "\n", " ").Replace(s) }

// table renders a markdown table with tablewriter; cells are escaped so a
// "|" in a label or path cannot split a column.
func table(w io.Writer, header []string, rows [][]string) error {
	t := tablewriter.NewTable(w,
		tablewriter.WithRenderer(renderer.NewMarkdown()),
		tablewriter.WithHeaderAutoFormat(tw.Off),
		tablewriter.WithHeaderAlignment(tw.AlignLeft),
		tablewriter.WithRowAlignment(tw.AlignLeft),
		tablewriter.WithRowAutoWrap(tw.WrapNone),
		tablewriter.WithHeaderAutoWrap(tw.WrapNone),
	)
	t.Header(header)
	for _, row := range rows {
		cells := make([]string, len(row))
		for i, c := range row {
			cells[i] = esc(c)
		}
		if err := t.Append(cells); err != nil {
			return fmt.Errorf("rendering table: %w", err)
		}
	}
	if err := t.Render(); err != nil {
		return fmt.Errorf("rendering table: %w", err)
	}
	return nil
}

// esc makes text safe inside a markdown table cell or list item.
func esc(s string) string {
	return strings.NewReplacer("|", `\|`, "\r\n", " ", "\n", " ", "<", "&lt;", ">", "&gt;").Replace(s)
}

func dur(sec *float64) string {
	if sec == nil {
		return "n/a"
	}
	d := time.Duration(*sec * float64(time.Second))
	if d >= time.Second {
		d = d.Round(time.Second)
	} else {
		d = d.Round(time.Millisecond)
	}
	return d.String()
}

func opt(v *float64, format string) string {
	if v == nil {
		return "n/a"
	}
	return fmt.Sprintf(format, *v)
}

func signedPct(f float64) string {
	if !finite(f) {
		return Num(f)
	}
	return fmt.Sprintf("%+.2f%%", f*100)
}
