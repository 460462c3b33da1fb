package spec

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestMarkerSpellingKeepsFingerprint: spacing and quoting inside a
// marker are spelling, not environment; before markers were tokenised
// these three gave three fingerprints.
func TestMarkerSpellingKeepsFingerprint(t *testing.T) {
	t.Parallel()
	spellings := []string{
		`triton==2.1.0; sys_platform=="linux"`,
		`triton==2.1.0; sys_platform == "linux"`,
		`triton==2.1.0; sys_platform == 'linux'`,
		"triton==2.1.0 ;\tsys_platform  ==\t'linux' ",
	}
	fps := map[string][]string{}
	for _, p := range spellings {
		s := &Spec{Runtime: Runtime{
			CUDA: "12.1.105", NvidiaDriver: "535.104.05", Python: "3.10.12", PyTorch: "2.1.0+cu121",
			Packages: []string{"numpy==1.26.4", p},
		}}
		fp, err := Fingerprint(s)
		if err != nil {
			t.Fatal(err)
		}
		fps[fp] = append(fps[fp], p)
	}
	if len(fps) != 1 {
		t.Errorf("%d fingerprints for one environment, want 1: %q", len(fps), fps)
	}
}

// TestMarkerSpellingValidates: the same spellings in a gpupass.yaml are
// valid and share the fingerprint Validate reports.
func TestMarkerSpellingValidates(t *testing.T) {
	t.Parallel()
	var fps []string
	for _, m := range []string{`'sys_platform=="linux"'`, `'sys_platform == "linux"'`, `"sys_platform == 'linux'"`} {
		src := fmt.Sprintf(`name: m
runtime:
  cuda: 12.1.105
  nvidia-driver: 535.104.05
  python: 3.10.12
  pytorch: 2.1.2+cu121
  packages:
    - numpy==1.26.4
    - %s
`, strings.Replace(m, "sys_platform", "triton==2.1.0; sys_platform", 1))
		res := Validate("gpupass.yaml", []byte(src))
		if !res.Valid {
			t.Fatalf("%s: not valid: %+v", m, res.Findings)
		}
		fps = append(fps, res.Fingerprint)
	}
	if fps[0] != fps[1] || fps[1] != fps[2] {
		t.Errorf("fingerprints differ: %v", fps)
	}
}

func TestCanonicalMarker(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		// Already canonical: returned byte for byte, so fingerprints
		// computed before markers were tokenised still hold.
		{`python_version >= "3.9"`, `python_version >= "3.9"`},
		{`sys_platform == "linux" and (platform_machine == "x86_64" or platform_machine == "aarch64")`,
			`sys_platform == "linux" and (platform_machine == "x86_64" or platform_machine == "aarch64")`},
		{`platform_version == 'has "quotes"'`, `platform_version == 'has "quotes"'`},
		// Spacing.
		{`sys_platform=="linux"`, `sys_platform == "linux"`},
		{"  sys_platform\t==  \"linux\"  ", `sys_platform == "linux"`},
		{`python_version>="3.9"and os_name=="posix"`, `python_version >= "3.9" and os_name == "posix"`},
		{`( python_version < "3.11" )`, `(python_version < "3.11")`},
		{`((os_name=="nt"))or(os_name=="posix")`, `((os_name == "nt")) or (os_name == "posix")`},
		{`"linux"in sys_platform`, `"linux" in sys_platform`},
		{`extra   not   in "a b"`, `extra not in "a b"`},
		// Quoting: double quotes unless the string holds one.
		{`sys_platform == 'linux'`, `sys_platform == "linux"`},
		{`platform_release == "it's"`, `platform_release == "it's"`},
		{`platform_release == 'say "hi"'`, `platform_release == 'say "hi"'`},
		{`platform_version == ''`, `platform_version == ""`},
		// String contents are data: spaces, ';' and operators inside stay.
		{`platform_version == '#1  SMP; x==y'`, `platform_version == "#1  SMP; x==y"`},
		// Every operator, and every term's order, as written.
		{`python_full_version===   "3.10.12"`, `python_full_version === "3.10.12"`},
		{`python_version~="3.10"`, `python_version ~= "3.10"`},
		{`python_version!="3.8"or python_version<="3.12"or python_version>"3"or python_version<"4"`,
			`python_version != "3.8" or python_version <= "3.12" or python_version > "3" or python_version < "4"`},
		{`os_name == "posix" or sys_platform == "win32" and extra == "gpu"`,
			`os_name == "posix" or sys_platform == "win32" and extra == "gpu"`},
		{`implementation_name=="cpython"and implementation_version>="3"and platform_system=="Linux"and platform_python_implementation=="CPython"`,
			`implementation_name == "cpython" and implementation_version >= "3" and platform_system == "Linux" and platform_python_implementation == "CPython"`},
		// Legacy names pip still accepts are kept as written.
		{`os.name=='posix'`, `os.name == "posix"`},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			t.Parallel()
			got, err := CanonicalMarker(tt.in)
			if err != nil {
				t.Fatalf("CanonicalMarker(%q): %v", tt.in, err)
			}
			if got != tt.want {
				t.Errorf("CanonicalMarker(%q) = %q, want %q", tt.in, got, tt.want)
			}
			again, err := CanonicalMarker(got)
			if err != nil || again != got {
				t.Errorf("canonical form is not stable: %q -> %q, %v", got, again, err)
			}
		})
	}
}

func TestCanonicalMarkerErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, in, msg, fix string
	}{
		{"unknown variable", `python_verison >= "3.9"`,
			`"python_verison" is not a marker variable; did you mean "python_version"?`, "write python_version"},
		{"unknown variable, no guess", `gpu == "h100"`,
			`"gpu" is not a marker variable`, "use a PEP 508 marker variable: python_version, "},
		{"keyword case", `sys_platform == "linux" AND os_name == "posix"`,
			`"AND" is not a marker variable`, ""},
		{"unquoted value", `python_version >= 3.9`,
			`value "3.9" is not quoted`, `quote the value: "3.9"`},
		{"unterminated double quote", `sys_platform == "linux`,
			`the string "\"linux" is not closed`, "close the string with the quote that opens it"},
		{"unterminated single quote", `sys_platform == 'linux" and os_name == "nt"`,
			`the string "'linux\" and os_name == \"nt\"" is not closed`, "no escapes"},
		{"assignment", `sys_platform = "linux"`, `"=" is not a marker operator`, "compare with =="},
		{"reversed", `python_version => "3.9"`, `"=>" is not a marker operator`, "compare with =="},
		{"not equal spelled <>", `python_version <> "3.9"`, `"<>" is not a marker operator`, "compare with =="},
		{"word operator", `sys_platform is "linux"`, `"is" is not a marker variable`, ""},
		{"no operator", `sys_platform "linux"`, `expected an operator after "sys_platform", found the string "linux"`, "compare with =="},
		{"not without in", `extra not "gpu"`, `"not" must be followed by "in"`, "not in"},
		{"missing value", `python_version >=`, `expected a marker variable or a quoted string after ">=", found the end of the marker`, "write `variable op"},
		{"dangling and", `os_name == "nt" and`, `expected a marker variable or a quoted string at the start of a comparison, found the end of the marker`, ""},
		{"two comparisons", `os_name == "nt" sys_platform == "win32"`, `unexpected "sys_platform" after "os_name == \"nt\""; join comparisons with and / or`, ""},
		{"unclosed paren", `(os_name == "nt" or os_name == "posix"`, `"(" is not closed`, "close every ( with a )"},
		{"extra close paren", `os_name == "nt")`, `")" has no matching "("`, "remove the extra )"},
		{"empty parens", `()`, `expected a marker variable or a quoted string at the start of a comparison, found ")"`, ""},
		{"C operators", `os_name == "nt" && extra == "x"`, `unexpected character '&'`, "join comparisons with and / or"},
		{"second semicolon", `os_name == "nt"; extra == "x"`, `unexpected character ';'`, ""},
		{"non-ASCII", `os_name == “nt”`, `unexpected non-ASCII character`, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := CanonicalMarker(tt.in)
			var me *MarkerError
			if !errors.As(err, &me) {
				t.Fatalf("CanonicalMarker(%q) = %q, %v; want a *MarkerError", tt.in, got, err)
			}
			if me.Msg != tt.msg {
				t.Errorf("message\n got %s\nwant %s", me.Msg, tt.msg)
			}
			if me.Fix == "" || !strings.Contains(me.Fix, tt.fix) {
				t.Errorf("fix %q, want one containing %q", me.Fix, tt.fix)
			}
		})
	}
}

// TestMarkerFinding: an invalid marker in gpupass.yaml is a package.syntax
// error at the package entry, with the marker's own fix.
func TestMarkerFinding(t *testing.T) {
	t.Parallel()
	src := []byte(`name: m
runtime:
  cuda: 12.1.105
  nvidia-driver: 535.104.05
  python: 3.10.12
  pytorch: 2.1.2+cu121
  packages:
    - numpy==1.26.4
    - triton==2.1.0; sys_platform = 'linux'
`)
	res := Validate("gpupass.yaml", src)
	if res.Valid || res.Fingerprint != "" {
		t.Fatalf("Valid = %v, fingerprint %q for an invalid marker", res.Valid, res.Fingerprint)
	}
	want := []Finding{{
		Rule: "package.syntax", Severity: SevError, File: "gpupass.yaml", Line: 9, Column: 7,
		Path:    "runtime.packages[1]",
		Message: `package "triton==2.1.0; sys_platform = 'linux'" is not a PEP 508 requirement: invalid environment marker: "=" is not a marker operator`,
		Fix:     fixMarkerOp,
	}}
	if diff := cmp.Diff(want, res.Findings); diff != "" {
		t.Errorf("findings (-want +got):\n%s", diff)
	}
}

// FuzzCanonicalMarker: no marker panics, every error is a *MarkerError
// with a fix, and the canonical form is a fixed point.
func FuzzCanonicalMarker(f *testing.F) {
	for _, s := range []string{
		`sys_platform=="linux"`, `sys_platform == "linux"`, `sys_platform == 'linux'`,
		`python_version >= "3.9" and (os_name == "nt" or extra not in 'a "b"')`,
		`"3.9"<=python_version`, `os.name=='posix'`, `(((extra=="x")))`,
		`python_version >= 3.9`, `sys_platform = "linux"`, `(os_name == "nt"`, `os_name == "nt")`,
		`sys_platform == "linux`, `extra not "x"`, `os_name == "nt" && extra == "x"`, `()`, "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		got, err := CanonicalMarker(s)
		if err != nil {
			var me *MarkerError
			if !errors.As(err, &me) || me.Msg == "" || me.Fix == "" {
				t.Fatalf("CanonicalMarker(%q): error %v is not a *MarkerError with a fix", s, err)
			}
			return
		}
		again, err := CanonicalMarker(got)
		if err != nil || again != got {
			t.Fatalf("CanonicalMarker(%q) = %q, which canonicalises to %q, %v", s, got, again, err)
		}
	})
}

// An empty marker gets the marker fix too, not the generic one.
func TestEmptyMarkerFix(t *testing.T) {
	t.Parallel()
	_, err := ParseRequirement("torch==2.3.1; ")
	var me *MarkerError
	if !errors.As(err, &me) || !strings.Contains(me.Fix, "drop the ';'") {
		t.Fatalf("ParseRequirement(\"torch==2.3.1; \") = %v, want a MarkerError whose fix says to drop the ';'", err)
	}
}
