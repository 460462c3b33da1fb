package gpupass_test

import (
	"regexp"
	"testing"
)

// TestValidateLocalAndUpDefaultToOnePython: `validate --local` must probe
// the interpreter `up` runs the jobs with, or a new user's check passes
// against one Python and the demo fails on another (#32 item 10).
func TestValidateLocalAndUpDefaultToOnePython(t *testing.T) {
	t.Parallel()
	def := regexp.MustCompile(`--python string[^\n]*\(default "([^"]+)"\)`)
	got := map[string]string{}
	for _, cmd := range []string{"validate", "up"} {
		code, out, errOut := runMain(t, cmd, "--help")
		if code != 0 {
			t.Fatalf("%s --help: exit %d\n%s%s", cmd, code, out, errOut)
		}
		m := def.FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("%s --help shows no default for --python:\n%s", cmd, out)
		}
		got[cmd] = m[1]
	}
	if got["validate"] != got["up"] {
		t.Errorf("validate --local probes %q by default, up runs jobs with %q: want one default", got["validate"], got["up"])
	}
}
