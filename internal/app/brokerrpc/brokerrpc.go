// Package brokerrpc words the broker's ConnectRPC errors for the use
// cases: what was being done, at which URL, and what to do when no broker
// answers. It names no flag; the command layer adds those.
package brokerrpc

import (
	"fmt"
	"strings"

	"github.com/gpupass/gpupass/internal/api"
)

// Error wraps a broker call's error: what is the action ("submitting the
// run in us-west"), url the broker's.
func Error(what, url string, err error) error {
	if api.NoAnswer(err) {
		return fmt.Errorf("%s at %s: no broker answers there (%s): start one with `gpupass up` (a local broker and agent) or `gpupass-broker serve`, or give the URL of a running one", what, url, strings.TrimPrefix(api.Describe(err), "no answer: "))
	}
	return fmt.Errorf("%s at %s: %s", what, url, api.Describe(err))
}
