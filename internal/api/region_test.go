package api

import "testing"

func TestCheckRegion(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		ok   bool
	}{
		{"us-west-2", true}, {"eu-central-1", true}, {"hpc-1", true}, {"a", true}, {"0", true},
		{"us-west-2,eu-central-1", false}, {"", false}, {"US-WEST-2", false}, {"us west", false},
		{"us-*", false}, {"-us", false}, {"us-", false}, {"us_west", false}, {"us-west-2\x1b[2J", false},
		{string(make([]byte, 64)), false},
	} {
		if err := CheckRegion(tc.name); (err == nil) != tc.ok {
			t.Errorf("CheckRegion(%q) = %v, want ok %v", tc.name, err, tc.ok)
		}
	}
	long := "a"
	for len(long) < 63 {
		long += "b"
	}
	if err := CheckRegion(long); err != nil {
		t.Errorf("63 characters refused: %v", err)
	}
}

// TestCheckRegionPattern: a scope or an --admission pattern follows the
// region rule outside its glob syntax, so it can match some region.
func TestCheckRegionPattern(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		p  string
		ok bool
	}{
		{"*", true}, {"us-*", true}, {"eu-central-1", true}, {"us-west-?", true}, {"us-[ew]*", true}, {"us-[^e]*", true},
		{"", false}, {"US-*", false}, {"us_west", false}, {"us west", false}, {"us/*", false}, {"eu-[", false},
		{`us-\*`, false}, {"us-west-2,eu-*", false},
	} {
		if err := CheckRegionPattern(tc.p); (err == nil) != tc.ok {
			t.Errorf("CheckRegionPattern(%q) = %v, want ok %v", tc.p, err, tc.ok)
		}
	}
}
