package wheel

import (
	"strconv"
	"strings"
)

// VersionsEqual reports whether two versions are equal under PEP 440's
// `==` without wildcards: the release segment is compared with trailing
// zeros padded (2.1 == 2.1.0), the rest as normalised text, and a local
// label (+cu121) must match exactly when the pin names one. A pin without
// a local label matches any local label, as pip does.
func VersionsEqual(pin, have string) bool {
	pp, pl := splitLocal(normVersion(pin))
	hp, hl := splitLocal(normVersion(have))
	if pl != "" && pl != hl {
		return false
	}
	pr, prest := splitRelease(pp)
	hr, hrest := splitRelease(hp)
	if prest != hrest {
		return false
	}
	for len(pr) < len(hr) {
		pr = append(pr, 0)
	}
	for len(hr) < len(pr) {
		hr = append(hr, 0)
	}
	for i := range pr {
		if pr[i] != hr[i] {
			return false
		}
	}
	return true
}

func normVersion(v string) string {
	v = strings.ToLower(strings.TrimSpace(v))
	v = strings.TrimPrefix(v, "v")
	// Wheel file names carry '_' where a version had '-' (PEP 427).
	v = strings.ReplaceAll(v, "_", "-")
	if i := strings.IndexByte(v, '+'); i >= 0 {
		v = v[:i] + "+" + strings.NewReplacer("-", ".").Replace(v[i+1:])
	}
	return v
}

func splitLocal(v string) (string, string) {
	if i := strings.IndexByte(v, '+'); i >= 0 {
		return v[:i], v[i+1:]
	}
	return v, ""
}

// splitRelease splits "1!2.1.0rc1" into the epoch-prefixed release numbers
// and the remainder ("rc1").
func splitRelease(v string) ([]int, string) {
	epoch := 0
	if i := strings.IndexByte(v, '!'); i >= 0 {
		epoch, _ = strconv.Atoi(v[:i])
		v = v[i+1:]
	}
	out := []int{epoch}
	i := 0
	for i < len(v) {
		j := i
		for j < len(v) && v[j] >= '0' && v[j] <= '9' {
			j++
		}
		if j == i {
			break
		}
		n, _ := strconv.Atoi(v[i:j])
		out = append(out, n)
		i = j
		if i < len(v) && v[i] == '.' && i+1 < len(v) && v[i+1] >= '0' && v[i+1] <= '9' {
			i++
			continue
		}
		break
	}
	rest := strings.TrimLeft(v[i:], ".-")
	return out, rest
}
