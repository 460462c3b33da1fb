package testutil

import "sync"

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)
