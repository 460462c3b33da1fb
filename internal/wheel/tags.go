package wheel

import (
	"fmt"
	"strconv"
	"strings"
)

// Target is the interpreter and platform a wheel must install on.
type Target struct {
	// Python is the CPython version, "3.10" or "3.10.12".
	Python string
	// OS and Arch name the platform: linux and x86_64 or aarch64.
	OS   string
	Arch string
	// GLIBC is the node's glibc version ("2.35"): manylinux wheels built
	// for a newer glibc do not install (PEP 600).
	GLIBC string
}

// DefaultTarget is what a GPU training node usually is: Linux on x86_64
// with the glibc of Ubuntu 22.04, the base of CUDA 12 images.
func DefaultTarget(python string) Target {
	return Target{Python: python, OS: "linux", Arch: "x86_64", GLIBC: "2.35"}
}

// TagSet is the set of tags a target accepts.
type TagSet map[Tag]bool

// Compatible reports whether any of tags installs on the target.
func (s TagSet) Compatible(tags []Tag) bool {
	for _, t := range tags {
		if s[t] {
			return true
		}
	}
	return false
}

// SupportedTags returns the tags pip would accept on the target, the way
// packaging.tags.sys_tags computes them for CPython: cpXY with its own
// ABI, abi3 down to cp32, none; pyXY/pyX with none; and any platform.
func SupportedTags(t Target) (TagSet, error) {
	major, minor, err := pythonVersion(t.Python)
	if err != nil {
		return nil, err
	}
	if major != 3 {
		return nil, fmt.Errorf("python %q: only CPython 3 is supported", t.Python)
	}
	plats, err := platforms(t)
	if err != nil {
		return nil, err
	}
	set := TagSet{}
	cp := fmt.Sprintf("cp%d%d", major, minor)
	for _, p := range plats {
		set[Tag{cp, cp, p}] = true
		set[Tag{cp, "abi3", p}] = true
		set[Tag{cp, "none", p}] = true
		for m := minor - 1; m >= 2; m-- {
			set[Tag{fmt.Sprintf("cp%d%d", major, m), "abi3", p}] = true
		}
		for m := minor; m >= 0; m-- {
			set[Tag{fmt.Sprintf("py%d%d", major, m), "none", p}] = true
		}
		set[Tag{fmt.Sprintf("py%d", major), "none", p}] = true
	}
	set[Tag{cp, "none", "any"}] = true
	for m := minor; m >= 0; m-- {
		set[Tag{fmt.Sprintf("py%d%d", major, m), "none", "any"}] = true
	}
	set[Tag{fmt.Sprintf("py%d", major), "none", "any"}] = true
	return set, nil
}

func pythonVersion(v string) (int, int, error) {
	parts := strings.Split(strings.TrimSpace(v), ".")
	if len(parts) < 2 {
		return 0, 0, fmt.Errorf("python version %q: want major.minor[.patch]", v)
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil || major < 0 || minor < 0 {
		return 0, 0, fmt.Errorf("python version %q: want major.minor[.patch]", v)
	}
	return major, minor, nil
}

// platforms lists the platform tags of the target, most specific first.
func platforms(t Target) ([]string, error) {
	arch := t.Arch
	switch t.OS {
	case "linux":
	default:
		return nil, fmt.Errorf("platform %s_%s: only linux targets are supported", t.OS, arch)
	}
	switch arch {
	case "x86_64", "aarch64", "ppc64le", "s390x", "i686", "armv7l":
	default:
		return nil, fmt.Errorf("architecture %q: want x86_64, aarch64, ppc64le, s390x, i686 or armv7l", arch)
	}
	gmaj, gmin, err := pythonVersion(t.GLIBC)
	if err != nil || gmaj != 2 {
		return nil, fmt.Errorf("glibc version %q: want 2.N", t.GLIBC)
	}
	var out []string
	// PEP 600: manylinux_2_X installs on glibc >= 2.X. x86_64 and i686
	// wheels start at 2.5 (manylinux1), the others at 2.17.
	low := 17
	if arch == "x86_64" || arch == "i686" {
		low = 5
	}
	for m := gmin; m >= low; m-- {
		out = append(out, fmt.Sprintf("manylinux_2_%d_%s", m, arch))
		// The legacy aliases of PEP 513, 571 and 599.
		switch m {
		case 17:
			out = append(out, "manylinux2014_"+arch)
		case 12:
			out = append(out, "manylinux2010_"+arch)
		case 5:
			out = append(out, "manylinux1_"+arch)
		}
	}
	return append(out, "linux_"+arch), nil
}
