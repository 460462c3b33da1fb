package api

import (
	"fmt"
	"path"
	"strings"
)

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
		bad = !regionByte(name[i])
	}
	if bad {
		return fmt.Errorf("region %q: use %s", name, RegionRule)
	}
	return nil
}

// CheckRegionPattern refuses a region glob (a token's scope, an
// --admission rule) that is not path.Match syntax or that names
// something CheckRegion would refuse: "US-*" or "us_west" would be
// stored and match no region, so the token or rule would silently do
// nothing.
func CheckRegionPattern(p string) error {
	_, err := path.Match(p, "")
	bad := p == "" || err != nil
	for i := 0; i < len(p) && !bad; i++ {
		bad = !regionByte(p[i]) && strings.IndexByte("*?[]^", p[i]) < 0
	}
	if bad {
		return fmt.Errorf("region pattern %q: use a region (%s) or a glob of one with * ? [...] (e.g. us-*, or * for all)", p, RegionRule)
	}
	return nil
}

func regionByte(c byte) bool { return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' }
