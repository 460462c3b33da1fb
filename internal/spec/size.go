package spec

import (
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

var sizeRe = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)$`) })

// sizeUnits: SI units are powers of 1000, IEC units powers of 1024, as
// written on the tin ("2GB" is 2e9 bytes, "2GiB" is 2^31).
var sizeUnits = map[string]float64{
	"": 1, "b": 1,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
}

// ParseSize parses a byte size with an optional unit: "2GB", "512MiB",
// "1073741824". It returns bytes.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "-") {
		return 0, fmt.Errorf("%q is negative; a size must be positive", s)
	}
	m := sizeRe().FindStringSubmatch(s)
	if m == nil {
		return 0, fmt.Errorf("%q is not a size such as 2GB or 512MiB", s)
	}
	mult, ok := sizeUnits[strings.ToLower(m[2])]
	if !ok {
		return 0, fmt.Errorf("unknown unit %q in %q: use B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024)", m[2], s)
	}
	f, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		return 0, fmt.Errorf("%q is not a size: %w", s, err)
	}
	b := math.Round(f * mult)
	if b <= 0 {
		return 0, fmt.Errorf("%q is zero; a size must be positive", s)
	}
	if b > 1<<53 {
		return 0, fmt.Errorf("%q is too large", s)
	}
	return int64(b), nil
}
