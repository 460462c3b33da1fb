package api

import "fmt"

// RegionRule is what CheckRegion allows, for error messages.
const RegionRule = "lowercase letters, digits and '-', 1 to 63 characters, starting and ending with a letter or digit (e.g. us-west-2)"

// CheckRegion refuses a name that cannot be one region: the broker on
// Submit and Enroll, and the CLI before it dials, hold every region to
// this one rule. A list ("us-west-2,eu-central-1"), a pattern or a name
// with spaces would otherwise become a region of its own that no node is
// in, kept in the runs table and the dashboard.
func CheckRegion(name string) error {
	bad := len(name) == 0 || len(name) > 63 || name[0] == '-' || name[len(name)-1] == '-'
	for i := 0; i < len(name) && !bad; i++ {
		c := name[i]
		bad = !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-')
	}
	if bad {
		return fmt.Errorf("region %q: use %s", name, RegionRule)
	}
	return nil
}
