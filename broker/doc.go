// Package broker is gpupass's control plane: the certified-node registry,
// scheduler and log store. It never imports the agent; both speak only
// through internal/api.
package broker
