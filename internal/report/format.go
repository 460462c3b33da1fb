package report

import (
	"fmt"
	"math"
	"strconv"
	"time"
)

// The figures of a report as people read them. The markdown, the JUnit
// messages and the broker's dashboard all format through these, so one
// comparison reads the same wherever it is shown; the JSON keeps the raw
// numbers. A missing figure (nil) is "n/a" everywhere.

// NA is a figure the run does not have (no timestamps, no price).
const NA = "n/a"

// Label names the pair as "A vs B": the runs in the order they were
// given, A first, A being the reference of the relative figures.
func (p Pair) Label() string { return p.A + " vs " + p.B }

// Cost formats a cost in USD: two decimals ("$0.27"), and under a cent
// two significant digits ("$0.0027"), so a short run does not read as
// free.
func Cost(usd *float64) string {
	if usd == nil {
		return NA
	}
	v := *usd
	if !finite(v) {
		return Num(v)
	}
	if v != 0 && math.Abs(v) < 0.01 {
		return "$" + roundSig(v, 2)
	}
	return "$" + strconv.FormatFloat(v, 'f', 2, 64)
}

// Throughput formats steps per second with three significant digits and
// no exponent: "188", "2810", "0.25".
func Throughput(sps *float64) string {
	if sps == nil {
		return NA
	}
	return Sig3(*sps)
}

// Sig3 formats v with three significant digits, written out ("2810",
// "0.0123"), not in exponent form; only where that would take more than
// a dozen digits (below 1e-6, from 1e12) does it fall back to "1.23e-07".
func Sig3(v float64) string {
	if !finite(v) {
		return Num(v)
	}
	if a := math.Abs(v); a != 0 && (a < 1e-6 || a >= 1e12) {
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	return roundSig(v, 3)
}

// roundSig rounds v to digits significant digits and writes it without an
// exponent or trailing zeros.
func roundSig(v float64, digits int) string {
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'e', digits-1, 64), 64)
	return strconv.FormatFloat(r, 'f', -1, 64)
}

// MaxAbsDeltaText is the pair's max |B−A| over its common steps with finite
// values and the step where it is largest. A zero difference has no such
// step (every common step ties), so it reads "0 (identical)"; "n/a" when
// no common step had finite values on both sides.
func (p Pair) MaxAbsDeltaText() string {
	d := float64(p.MaxAbsDelta)
	switch {
	case p.Error != "" || math.IsNaN(d):
		return NA
	case d == 0 && p.NonFiniteSteps > 0:
		return "0 (identical where finite)"
	case d == 0:
		return "0 (identical)"
	case !finite(d):
		return Num(d)
	}
	return Sig3(d) + " (step " + strconv.FormatInt(p.MaxAbsDeltaStep, 10) + ")"
}

// RelFinalDiffText is the pair's (B−A)/|A| at the last common step as a
// signed percentage: "+1.51%".
func (p Pair) RelFinalDiffText() string {
	if p.Error != "" {
		return NA
	}
	return SignedPercent(float64(p.RelFinalDiff))
}

// WorstText is the largest difference a check saw: like MaxAbsDelta for
// abs, a percentage for rel (as its limit is written).
func (c Check) WorstText() string {
	w := float64(c.Worst)
	switch {
	case math.IsNaN(w):
		return NA
	case c.Kind == "rel":
		return pct(w)
	}
	return Sig3(w)
}

// LimitText is the check's bound as the tolerance was written: "0.05"
// or "2%".
func (c Check) LimitText() string {
	if c.Kind == "rel" {
		return pct(c.Limit)
	}
	return Num(c.Limit)
}

// SignedPercent formats a ratio as a percentage with a sign and two
// decimals: "+1.51%", "-0.20%".
func SignedPercent(f float64) string {
	if !finite(f) {
		return Num(f)
	}
	return fmt.Sprintf("%+.2f%%", f*100)
}

// Duration formats seconds as a Go duration rounded to the second, or
// to the millisecond under one: "1m40s", "250ms".
func Duration(sec *float64) string {
	if sec == nil {
		return NA
	}
	d := time.Duration(*sec * float64(time.Second))
	if d >= time.Second {
		d = d.Round(time.Second)
	} else {
		d = d.Round(time.Millisecond)
	}
	return d.String()
}
