// Package wheel reads Python wheel files (PEP 427): their file names and
// compatibility tags (PEP 425, PEP 600 manylinux), and the RECORD that
// lists every file of the archive with its hash. It is pure: it reads
// files it is given and never touches the network.
package wheel

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
)

// Tag is one compatibility tag triple: python-abi-platform.
type Tag struct {
	Python   string `json:"python"`
	ABI      string `json:"abi"`
	Platform string `json:"platform"`
}

func (t Tag) String() string { return t.Python + "-" + t.ABI + "-" + t.Platform }

// Filename is a parsed wheel file name:
// {distribution}-{version}(-{build})?-{python}-{abi}-{platform}.whl
type Filename struct {
	File         string // the name as given
	Distribution string // as written in the file name
	Version      string
	Build        string
	// TagSet is the python-abi-platform part as written (it may hold
	// compressed sets such as py2.py3-none-any).
	TagSet string
	// Tags is TagSet expanded into every triple it names.
	Tags []Tag
}

// Name returns the distribution name normalised as PEP 503 says, so that
// Flash_Attn, flash-attn and flash.attn compare equal.
func (f Filename) Name() string { return NormalizeName(f.Distribution) }

var (
	// PEP 427 escapes every run of non-alphanumerics in the name with one
	// underscore; older tools left dots, so dots are accepted too.
	distRe    = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?$`)
	versionRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._+!]*$`)
	buildRe   = regexp.MustCompile(`^[0-9][A-Za-z0-9_.]*$`)
	tagRe     = regexp.MustCompile(`^[A-Za-z0-9_.]+$`)
)

// ParseFilename parses a wheel file name. It refuses anything that is not
// a plain file name, so a name from a registry or a zip can never carry a
// path with it.
func ParseFilename(file string) (Filename, error) {
	if file == "" || strings.ContainsAny(file, `/\`+"\x00") || file == "." || file == ".." {
		return Filename{}, fmt.Errorf("wheel file name %q: must be a plain file name without path separators", file)
	}
	if !strings.HasSuffix(file, ".whl") {
		return Filename{}, fmt.Errorf("wheel file name %q: does not end in .whl", file)
	}
	parts := strings.Split(strings.TrimSuffix(file, ".whl"), "-")
	f := Filename{File: file}
	switch len(parts) {
	case 5:
		f.Distribution, f.Version = parts[0], parts[1]
	case 6:
		f.Distribution, f.Version, f.Build = parts[0], parts[1], parts[2]
	default:
		return Filename{}, fmt.Errorf("wheel file name %q: want name-version[-build]-python-abi-platform.whl (PEP 427), got %d dash-separated parts", file, len(parts))
	}
	n := len(parts)
	py, abi, plat := parts[n-3], parts[n-2], parts[n-1]
	switch {
	case !distRe.MatchString(f.Distribution):
		return Filename{}, fmt.Errorf("wheel file name %q: invalid distribution name %q", file, f.Distribution)
	case !versionRe.MatchString(f.Version):
		return Filename{}, fmt.Errorf("wheel file name %q: invalid version %q", file, f.Version)
	case f.Build != "" && !buildRe.MatchString(f.Build):
		return Filename{}, fmt.Errorf("wheel file name %q: invalid build tag %q (must start with a digit)", file, f.Build)
	}
	for _, p := range []string{py, abi, plat} {
		if !tagRe.MatchString(p) || strings.HasPrefix(p, ".") || strings.HasSuffix(p, ".") || strings.Contains(p, "..") {
			return Filename{}, fmt.Errorf("wheel file name %q: invalid tag %q", file, p)
		}
	}
	f.TagSet = py + "-" + abi + "-" + plat
	for _, a := range strings.Split(py, ".") {
		for _, b := range strings.Split(abi, ".") {
			for _, c := range strings.Split(plat, ".") {
				f.Tags = append(f.Tags, Tag{a, b, c})
			}
		}
	}
	sort.Slice(f.Tags, func(i, j int) bool { return f.Tags[i].String() < f.Tags[j].String() })
	return f, nil
}
