package bundle

import (
	"fmt"
	"strings"

	"github.com/gpupass/gpupass/internal/spec"
	"github.com/gpupass/gpupass/internal/wheel"
)

// Pin is one `name==version` requirement of a spec.
type Pin struct {
	Name    string `json:"name"` // PEP 503 normalised
	Version string `json:"version"`
	Raw     string `json:"requirement"`
}

// ParsePins parses a spec's runtime.packages. Every entry must be pinned
// with == (the spec's rule); anything else is an error naming the entry.
func ParsePins(pkgs []string) ([]Pin, error) {
	var out []Pin
	for i, p := range pkgs {
		r, err := spec.ParseRequirement(p)
		if err != nil {
			return nil, fmt.Errorf("runtime.packages[%d] %q: %w", i, p, err)
		}
		v, ok := r.Pinned()
		if !ok || r.Marker != "" {
			return nil, fmt.Errorf("runtime.packages[%d] %q: want name==version (an exact pin, no marker)", i, p)
		}
		out = append(out, Pin{Name: spec.NormalizeName(r.Name), Version: v.String(), Raw: p})
	}
	return out, nil
}

// Coverage says whether a wheelhouse holds an installable wheel for every
// pin of a spec.
type Coverage struct {
	Python       string         `json:"python"`
	Platform     string         `json:"platform"`
	Covered      []CoveredPin   `json:"covered"`
	Missing      []Pin          `json:"missing"`
	Incompatible []Incompatible `json:"incompatible"`
}

// CoveredPin names the wheel that satisfies a pin.
type CoveredPin struct {
	Pin  Pin    `json:"pin"`
	File string `json:"file"`
}

// Incompatible is a pin with wheels of the right version, none of which
// installs on the target.
type Incompatible struct {
	Pin   Pin      `json:"pin"`
	Files []string `json:"files"`
}

// Complete reports whether every pin is covered.
func (c Coverage) Complete() bool { return len(c.Missing) == 0 && len(c.Incompatible) == 0 }

// Problems lists what is missing, one line each, with the fix.
func (c Coverage) Problems() []string {
	var out []string
	for _, p := range c.Missing {
		out = append(out, fmt.Sprintf("%s: no wheel for this version in the wheelhouse (add it: pip download --only-binary=:all: --python-version %s --platform %s %s)", p.Raw, c.Python, c.Platform, p.Raw))
	}
	for _, p := range c.Incompatible {
		out = append(out, fmt.Sprintf("%s: %s do not install on python %s / %s (add a wheel built for it)", p.Pin.Raw, strings.Join(p.Files, ", "), c.Python, c.Platform))
	}
	return out
}

// CheckCoverage checks wheels against pins for the target.
func CheckCoverage(pins []Pin, t wheel.Target, wheels []Wheel) (Coverage, error) {
	supported, err := wheel.SupportedTags(t)
	if err != nil {
		return Coverage{}, err
	}
	c := Coverage{
		Python: t.Python, Platform: fmt.Sprintf("manylinux_%s_%s", strings.ReplaceAll(t.GLIBC, ".", "_"), t.Arch),
		Covered: []CoveredPin{}, Missing: []Pin{}, Incompatible: []Incompatible{},
	}
	for _, p := range pins {
		var versionMatch []string
		found := ""
		for _, w := range wheels {
			if w.Name != p.Name {
				continue
			}
			// A version that is not PEP 440 cannot satisfy a pin.
			if match, err := spec.PinMatches(p.Version, w.Version); err != nil || !match {
				continue
			}
			versionMatch = append(versionMatch, w.File)
			tags, err := parseTags(w.Tags)
			if err != nil {
				return Coverage{}, fmt.Errorf("wheel %s: %w", w.File, err)
			}
			if found == "" && supported.Compatible(tags) {
				found = w.File
			}
		}
		switch {
		case found != "":
			c.Covered = append(c.Covered, CoveredPin{Pin: p, File: found})
		case len(versionMatch) > 0:
			c.Incompatible = append(c.Incompatible, Incompatible{Pin: p, Files: versionMatch})
		default:
			c.Missing = append(c.Missing, p)
		}
	}
	return c, nil
}

func parseTags(ss []string) ([]wheel.Tag, error) {
	out := make([]wheel.Tag, 0, len(ss))
	for _, s := range ss {
		p := strings.Split(s, "-")
		if len(p) != 3 {
			return nil, fmt.Errorf("tag %q: want python-abi-platform", s)
		}
		out = append(out, wheel.Tag{Python: p[0], ABI: p[1], Platform: p[2]})
	}
	return out, nil
}
