package wheel_test

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/gpupass/gpupass/internal/wheel"
	"github.com/gpupass/gpupass/internal/wheel/wheeltest"
)

// FuzzVerify feeds arbitrary bytes to both wheel checks: they must never
// panic, and a wheel the stream check accepts must pass Inspect too (the
// two must not disagree about what pip would extract).
func FuzzVerify(f *testing.F) {
	dir := f.TempDir()
	for i, o := range []wheeltest.Options{{}, {Store: true}, {StoreDescriptor: true}, {LieAbout: "demo/__init__.py"}, {DeflateSized: true}, {DeflateSized: true, LieAbout: "demo/__init__.py"}} {
		p, err := wheeltest.Write(dir, "demo-1.0-py3-none-any.whl", "demo", "1.0",
			[]wheeltest.File{{Name: "demo/__init__.py", Data: strings.NewReader("x = " + string(rune('0'+i)) + "\n")}}, o)
		if err != nil {
			f.Fatal(err)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	fn, err := wheel.ParseFilename("demo-1.0-py3-none-any.whl")
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := wheel.VerifyStream(bytes.NewReader(b), fn)
		streamOK := err == nil && s.Check(bytes.NewReader(b), int64(len(b))) == nil
		inspectOK := wheel.VerifyReader(bytes.NewReader(b), int64(len(b)), fn) == nil
		if streamOK && !inspectOK {
			t.Fatalf("the stream check accepted a wheel Inspect refuses")
		}
	})
}
