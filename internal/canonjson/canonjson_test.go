package canonjson

import (
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
		{"big integers stay exact", map[string]any{"n": int64(9007199254740993)}, `{"n":9007199254740993}`},
		{"nested arrays keep order", []any{map[string]int{"b": 1, "a": 2}, "s"}, `[{"a":2,"b":1},"s"]`},
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
