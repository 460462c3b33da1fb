//go:build !nokube

package agent

import "github.com/gpupass/gpupass/agent/executor/kubernetes"

// The Kubernetes executor links client-go (about 18 MB of the agent): the
// agent that runs in or beside a cluster has it; the agent for a GPU node
// (-tags nokube, scripts/release/build.sh) leaves it out.
func init() { backends = append(backends, kubernetes.Backend) }
