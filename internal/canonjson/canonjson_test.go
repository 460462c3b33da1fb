package canonjson

import (
	"encoding/json"
	"math"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestMarshal(t *testing.T) {
	t.Parallel()
	type inner struct {
		Z string `json:"z"`
		A int    `json:"a"`
	}
	type outer struct {
		B     bool              `json:"b"`
		Inner inner             `json:"inner"`
		M     map[string]string `json:"m"`
		HTML  string            `json:"html"`
		F     float64           `json:"f"`
	}
	tests := []struct {
		name string
		in   any
		want string
	}{
		{"struct order does not leak", outer{B: true, Inner: inner{Z: "z", A: 1}, M: map[string]string{"y": "1", "x": "2"}, HTML: "<a&b>", F: 0.5},
			`{"b":true,"f":0.5,"html":"<a&b>","inner":{"a":1,"z":"z"},"m":{"x":"2","y":"1"}}`},
		{"integers up to 2^53 stay exact", map[string]any{"n": int64(9007199254740992), "m": int64(-9007199254740992)},
			`{"m":-9007199254740992,"n":9007199254740992}`},
		{"nested arrays keep order", []any{map[string]int{"b": 1, "a": 2}, "s"}, `[{"a":2,"b":1},"s"]`},
		// Issue #19: the old encoder kept these as encoding/json wrote them.
		{"U+2028 and U+2029 are not escaped", "a\u2028b\u2029c", "\"a\u2028b\u2029c\""},
		{"raw numbers are normalised", json.RawMessage(`{"b":1.50,"a":1e2,"c":-0,"d":1E21}`), `{"a":100,"b":1.5,"c":0,"d":1e+21}`},
		{"json.Number is normalised", map[string]json.Number{"x": "1.50"}, `{"x":1.5}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Marshal(tt.in)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("Marshal mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestRFC8785Numbers is RFC 8785 appendix B: IEEE 754 doubles (as bit
// patterns) and their canonical text.
func TestRFC8785Numbers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		bits uint64
		want string
	}{
		{0x0000000000000000, "0"},
		{0x8000000000000000, "0"}, // -0
		{0x0000000000000001, "5e-324"},
		{0x8000000000000001, "-5e-324"},
		{0x7fefffffffffffff, "1.7976931348623157e+308"},
		{0xffefffffffffffff, "-1.7976931348623157e+308"},
		{0x4340000000000000, "9007199254740992"},
		{0xc340000000000000, "-9007199254740992"},
		{0x4430000000000000, "295147905179352830000"},
		{0x44b52d02c7e14af5, "9.999999999999997e+22"},
		{0x44b52d02c7e14af6, "1e+23"},
		{0x44b52d02c7e14af7, "1.0000000000000001e+23"},
		{0x444b1ae4d6e2ef4e, "999999999999999700000"},
		{0x444b1ae4d6e2ef4f, "999999999999999900000"},
		{0x444b1ae4d6e2ef50, "1e+21"},
		{0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"},
		{0x3eb0c6f7a0b5ed8d, "0.000001"},
		{0x41b3de4355555553, "333333333.3333332"},
		{0x41b3de4355555554, "333333333.33333325"},
		{0x41b3de4355555555, "333333333.3333333"},
		{0x41b3de4355555556, "333333333.3333334"},
		{0x41b3de4355555557, "333333333.33333343"},
		{0xbecbf647612f3696, "-0.0000033333333333333333"},
		{0x43143ff3c1cb0959, "1424953923781206.2"},
	}
	for _, tt := range tests {
		f := math.Float64frombits(tt.bits)
		got, err := Marshal([]float64{f})
		if err != nil {
			t.Errorf("Marshal(%#x): %v", tt.bits, err)
			continue
		}
		if string(got) != "["+tt.want+"]" {
			t.Errorf("Marshal(%#x) = %s, want [%s]", tt.bits, got, tt.want)
		}
	}
	// NaN and infinities are not JSON (RFC 8785 3.2.2.3).
	for _, f := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, err := Marshal(f); err == nil {
			t.Errorf("Marshal(%v) succeeded, want an error", f)
		}
	}
}

// TestRFC8785Transform is RFC 8785's own examples: 3.2.2 (values), 3.2.3
// (sorting by UTF-16 code units) and the reference test data's "weird"
// keys, given as JSON text.
func TestRFC8785Transform(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"values (3.2.2)", `{
  "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
  "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
  "literals": [null, true, false]
}`, `{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`},
		{"sorting (3.2.3)", `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "1": "One",
  "\ud83d\ude00": "Emoji: Grinning Face",
  "\u0080": "Control",
  "\u00f6": "Latin Small Letter O With Diaeresis"
}`, "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u0080\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\"," +
			"\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{"weird keys (test data)", `{
  "\u20ac": "Euro Sign",
  "\r": "Carriage Return",
  "\u000a": "Newline",
  "1": "One",
  "\u0080": "Control\u007f",
  "\ud83d\ude02": "Smiley",
  "\u00f6": "Latin Small Letter O With Diaeresis",
  "\ufb33": "Hebrew Letter Dalet With Dagesh",
  "</script>": "Browser Challenge"
}`, "{\"\\n\":\"Newline\",\"\\r\":\"Carriage Return\",\"1\":\"One\",\"</script>\":\"Browser Challenge\",\"\u0080\":\"Control\u007f\"," +
			"\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😂\":\"Smiley\",\"\ufb33\":\"Hebrew Letter Dalet With Dagesh\"}"},
		{"nested structures", `[56,{"d":true,"10":null,"1":[]}]`, `[56,{"1":[],"10":null,"d":true}]`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := Transform([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(got)); diff != "" {
				t.Errorf("Transform (-want +got):\n%s", diff)
			}
			// The one encoder: Marshal of the decoded value agrees.
			var v any
			if err := json.Unmarshal([]byte(tt.in), &v); err != nil {
				t.Fatal(err)
			}
			if got, err := Marshal(v); err != nil || string(got) != tt.want {
				t.Errorf("Marshal = %s, %v; want %s", got, err, tt.want)
			}
		})
	}
}

// TestInexactIntegers: an integer a double cannot hold is refused, never
// rounded into a signature.
func TestInexactIntegers(t *testing.T) {
	t.Parallel()
	for _, in := range []any{
		map[string]any{"n": int64(9007199254740993)},
		[]uint64{math.MaxUint64},
		json.RawMessage(`{"a":-9007199254740993}`),
	} {
		if got, err := Marshal(in); err == nil || !strings.Contains(err.Error(), "2^53") {
			t.Errorf("Marshal(%v) = %s, %v; want an error naming 2^53", in, got, err)
		}
	}
}
