package api

import (
	"fmt"
	"regexp"
)

// GroupIDPrefix starts every run group id the broker draws.
const GroupIDPrefix = "group-"

var groupIDForm = regexp.MustCompile(`^group-[0-9a-f]{16}$`)

// CheckGroupID refuses a string that is not a run group id as the broker
// draws them ("group-" and 16 hex digits): it goes into a store query and
// back into `gpupass runs --group`, so anything else is a typo.
func CheckGroupID(id string) error {
	if !groupIDForm.MatchString(id) {
		return fmt.Errorf("run group %q: a group id is %s followed by 16 hex digits, as gpupass train prints it", id, GroupIDPrefix)
	}
	return nil
}
