package events

import "testing"

func TestOutcome(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ state, reason, want string }{
		{"cancelled", "cancelled by user", "cancelled by user"},
		{"cancelled", "cancelled", "cancelled"},
		{"failed", "exited with status 1", "failed: exited with status 1"},
		{"cancelled", "cancellation of the node", "cancelled: cancellation of the node"},
		{"succeeded", "", "succeeded"},
	} {
		if got := Outcome(tc.state, tc.reason); got != tc.want {
			t.Errorf("Outcome(%q, %q) = %q, want %q", tc.state, tc.reason, got, tc.want)
		}
	}
}
