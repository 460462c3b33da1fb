//go:build nokube

package agent

// This is the agent for a GPU node: no client-go (importing
// agent/executor/kubernetes, even for its Name, would link it).
// --executor kubernetes says which agent has it.
func init() {
	missingBackends["kubernetes"] = "this gpupass-agent is the GPU node build (-tags nokube); the Kubernetes executor is in the default build and the gpupass-agent image"
}
