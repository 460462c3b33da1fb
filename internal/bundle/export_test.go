package bundle

import "time"

// Hooks for the external tests.
var WheelsRead = &wheelsRead

func SetRacyWindow(d time.Duration) { racyWindow = d }
