//go:build fakeexecutor

package agent

import "github.com/gpupass/gpupass/agent/executor/fake"

// A gpupass-agent built with -tags fakeexecutor has the test-only fake
// executor: end-to-end tests start it from gpupass up (as woodpecker's
// dummy backend is built in with -tags test). No release builds it.
func init() { backends = append(backends, fake.Backend) }
