package executor

import (
	"testing"

	"github.com/gpupass/gpupass/internal/command/flagenv"
)

// TestAgentEnvPrefix: the prefix JobEnviron strips is the one every agent
// flag's variable has, so no agent secret reaches a job.
func TestAgentEnvPrefix(t *testing.T) {
	t.Parallel()
	if agentEnvPrefix != flagenv.Prefix {
		t.Errorf("agentEnvPrefix %q, flagenv.Prefix %q", agentEnvPrefix, flagenv.Prefix)
	}
}
