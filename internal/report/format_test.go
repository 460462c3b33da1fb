package report

import (
	"math"
	"testing"
)

func TestFormats(t *testing.T) {
	t.Parallel()
	f := func(v float64) *float64 { return &v }
	for _, tc := range []struct {
		name string
		got  string
		want string
	}{
		{"cost nil", Cost(nil), "n/a"},
		{"cost zero", Cost(f(0)), "$0.00"},
		{"cost cents", Cost(f(0.2689)), "$0.27"},
		{"cost one cent", Cost(f(0.01)), "$0.01"},
		{"cost dollars", Cost(f(1234.5)), "$1234.50"},
		{"cost under a cent", Cost(f(0.0026518)), "$0.0027"},
		{"cost just under a cent", Cost(f(0.00996)), "$0.01"},
		{"cost tiny", Cost(f(0.000012345)), "$0.000012"},
		{"cost NaN", Cost(f(math.NaN())), "NaN"},
		{"throughput nil", Throughput(nil), "n/a"},
		{"throughput hundreds", Throughput(f(188.456)), "188"},
		{"throughput thousands", Throughput(f(2812.3)), "2810"},
		{"throughput round thousands", Throughput(f(2800)), "2800"},
		{"throughput millions", Throughput(f(1.2345e6)), "1230000"},
		{"throughput slow", Throughput(f(0.012345)), "0.0123"},
		{"throughput one", Throughput(f(1)), "1"},
		{"sig3 negative", Sig3(-0.0123456), "-0.0123"},
		{"sig3 tiny", Sig3(1.234e-9), "1.23e-09"},
		{"sig3 huge", Sig3(1.234e15), "1.23e+15"},
		{"sig3 Inf", Sig3(math.Inf(1)), "+Inf"},
		{"duration nil", Duration(nil), "n/a"},
		{"duration", Duration(f(100.4)), "1m40s"},
		{"duration under a second", Duration(f(0.2504)), "250ms"},
		{"signed percent", SignedPercent(0.0151), "+1.51%"},
		{"signed percent negative", SignedPercent(-0.002), "-0.20%"},
		{"signed percent Inf", SignedPercent(math.Inf(1)), "+Inf"},
	} {
		if tc.got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, tc.got, tc.want)
		}
	}
}

func TestPairTexts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name           string
		p              Pair
		label, max, rf string
	}{
		{"differs", Pair{A: "us-west-2", B: "eu-central-1", MaxAbsDelta: 0.012345, MaxAbsDeltaStep: 60, RelFinalDiff: 0.0151},
			"us-west-2 vs eu-central-1", "0.0123 (step 60)", "+1.51%"},
		{"large difference", Pair{A: "a", B: "b", MaxAbsDelta: 2812.3, MaxAbsDeltaStep: 7, RelFinalDiff: -0.5},
			"a vs b", "2810 (step 7)", "-50.00%"},
		// Every common step ties at zero: naming the first of them as
		// "the" step would read as a finding.
		{"identical", Pair{A: "a", B: "b", MaxAbsDelta: 0, MaxAbsDeltaStep: 1},
			"a vs b", "0 (identical)", "+0.00%"},
		{"identical where finite", Pair{A: "a", B: "b", MaxAbsDelta: 0, MaxAbsDeltaStep: 1, NonFiniteSteps: 2},
			"a vs b", "0 (identical where finite)", "+0.00%"},
		{"no finite step", Pair{A: "a", B: "b", MaxAbsDelta: Float(math.NaN()), RelFinalDiff: Float(math.NaN()), NonFiniteSteps: 3},
			"a vs b", "n/a", "NaN"},
		{"not compared", Pair{A: "a", B: "b", MaxAbsDelta: Float(math.NaN()), RelFinalDiff: Float(math.NaN()), Error: "no common steps"},
			"a vs b", "n/a", "n/a"},
	} {
		if got := tc.p.Label(); got != tc.label {
			t.Errorf("%s: label %q, want %q", tc.name, got, tc.label)
		}
		if got := tc.p.MaxAbsDeltaText(); got != tc.max {
			t.Errorf("%s: max |Δ| %q, want %q", tc.name, got, tc.max)
		}
		if got := tc.p.RelFinalDiffText(); got != tc.rf {
			t.Errorf("%s: rel final diff %q, want %q", tc.name, got, tc.rf)
		}
	}
}

func TestCheckTexts(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c            Check
		worst, limit string
	}{
		{Check{Kind: "abs", Limit: 0.05, Worst: 0.0123456}, "0.0123", "0.05"},
		{Check{Kind: "rel", Limit: 0.02, Worst: 0.0150862}, "1.509%", "2%"},
		{Check{Kind: "abs", Limit: 0.05, Worst: Float(math.NaN())}, "n/a", "0.05"},
	} {
		if got := tc.c.WorstText(); got != tc.worst {
			t.Errorf("%s check worst %v: %q, want %q", tc.c.Kind, tc.c.Worst, got, tc.worst)
		}
		if got := tc.c.LimitText(); got != tc.limit {
			t.Errorf("%s check limit %v: %q, want %q", tc.c.Kind, tc.c.Limit, got, tc.limit)
		}
	}
}
