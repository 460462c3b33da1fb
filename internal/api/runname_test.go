package api

import "testing"

func TestCheckRunName(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"bert-base_v1.2", true}, {"训练-任务", true}, {"e2e-us-west-2-abc1234", true},
		{"", false}, {"-leading", false}, {"has space", false}, {"x\x1b[2J", false}, {"ok\u202eevil", false},
		{"n\u0085el", false}, {"a/b", false}, {string(make([]byte, 129)), false}, {"bad\xff", false},
	} {
		if err := CheckRunName(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckRunName(%q) = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
