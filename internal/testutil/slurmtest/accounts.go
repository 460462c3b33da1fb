package slurmtest

import (
	"fmt"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// AccountName is the name RunAccounts gives uid's account.
func AccountName(uid int) string { return fmt.Sprintf("gpupass-e2e-%d", uid) }

// RunAccounts makes uids first..first+count-1 accounts (each with a
// group of its gid, named AccountName), as a site does on every node:
// this Slurm (22.05) refuses sbatch --uid for a uid the user database
// does not list ("Invalid --uid specification"). It returns the uids as
// an agent's uid range ("FIRST-LAST"). Each uid must be no account or
// group yet: test binaries that run at once take ranges of their own.
// Cleanup cancels the uids' jobs on c and removes exactly what it added.
func RunAccounts(t testing.TB, c *Cluster, first, count int) string {
	t.Helper()
	testutil.NeedRoot(t)
	for _, tool := range []string{"useradd", "userdel", "groupadd", "groupdel"} {
		if _, err := exec.LookPath(tool); err != nil {
			testutil.Missing(t, "%s (passwd) to make the job users' accounts", tool)
		}
	}
	for i := range count {
		id := strconv.Itoa(first + i)
		if u, err := user.LookupId(id); err == nil {
			t.Fatalf("uid %s is account %s already: pick another range for the test", id, u.Username)
		}
		if g, err := user.LookupGroupId(id); err == nil {
			t.Fatalf("gid %s is group %s already: pick another range for the test", id, g.Name)
		}
	}
	run := func(name string, args ...string) error {
		out, err := exec.Command(name, args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s %s: %v: %s", name, strings.Join(args, " "), err, out)
		}
		return nil
	}
	t.Cleanup(func() {
		// A job of a uid (or slurmstepd's processes of it) keeps userdel
		// from removing it: end them first.
		deadline := time.Now().Add(time.Minute)
		for i := range count {
			stop := exec.Command("scancel", "-u", strconv.Itoa(first+i))
			stop.Env = c.Env()
			_ = stop.Run()
		}
		for i := range count {
			name := AccountName(first + i)
			for {
				err := run("userdel", name)
				if err == nil || time.Now().After(deadline) {
					if err != nil {
						t.Errorf("removing the test's account: %v", err)
					}
					break
				}
				time.Sleep(500 * time.Millisecond)
			}
			// userdel removes the group of the user's name with it
			// (USERGROUPS_ENAB); else it is removed here.
			if _, err := user.LookupGroup(name); err == nil {
				if err := run("groupdel", name); err != nil {
					t.Errorf("removing the test's group: %v", err)
				}
			}
		}
	})
	for i := range count {
		id := strconv.Itoa(first + i)
		if err := run("groupadd", "-g", id, AccountName(first+i)); err != nil {
			t.Fatal(err)
		}
		if err := run("useradd", "-M", "-N", "-u", id, "-g", id, "-d", "/nonexistent", "-s", "/usr/sbin/nologin", AccountName(first+i)); err != nil {
			t.Fatal(err)
		}
	}
	return fmt.Sprintf("%d-%d", first, first+count-1)
}
