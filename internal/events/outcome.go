package events

import "strings"

// Outcome words a run's end as "STATE: REASON", or as the reason alone
// when it already starts with the state ("cancelled by user"), so no
// line reads "cancelled: cancelled by user". The agent's last event and
// the CLI's summary of runs that did not succeed both use it.
func Outcome(state, reason string) string {
	switch {
	case reason == "":
		return state
	case reason == state || strings.HasPrefix(reason, state+" ") || strings.HasPrefix(reason, state+":"):
		return reason
	}
	return state + ": " + reason
}
