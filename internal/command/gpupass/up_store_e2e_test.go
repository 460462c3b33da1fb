//go:build e2e

package gpupass_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/gpupass/gpupass/internal/testutil/upstack"
)

// TestUpStoreFilesOwnerOnly (issue #31): the store `gpupass up` runs its
// broker on (broker.db, -wal, -shm in the state dir) is the user's alone,
// whatever the umask `up` inherits: a local user who could read it could
// read run logs and evidence.
func TestUpStoreFilesOwnerOnly(t *testing.T) {
	if b, err := os.ReadFile("/proc/self/status"); err == nil {
		if m := regexp.MustCompile(`(?m)^Umask:\s+([0-7]+)$`).FindSubmatch(b); m != nil {
			if u, _ := strconv.ParseUint(string(m[1]), 8, 32); u&0o044 != 0 {
				t.Logf("umask %04o already hides files from other users: this run cannot tell a 0600 store from one left to the umask", u)
			}
		}
	}
	s := upstack.Start(t, upstack.Options{Regions: []string{"us-west-2"}})
	for _, name := range []string{"broker.db", "broker.db-wal", "broker.db-shm"} {
		fi, err := os.Stat(filepath.Join(s.State, name))
		if err != nil {
			t.Fatalf("after gpupass up: %v", err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("after gpupass up %s is %v, want -rw------- (0600)", name, fi.Mode().Perm())
		}
	}
}
