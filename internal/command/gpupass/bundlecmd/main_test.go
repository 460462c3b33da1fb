package bundlecmd_test

import (
	"os"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil"
)

// The CLI's tests run with none of the developer's gpupass setup (a
// context `gpupass up` saved, an exported GPUPASS_STATE_DIR).
func TestMain(m *testing.M) { os.Exit(testutil.RunIsolatedFromUser(m)) }
