package slurm

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Node is one compute node as Slurm describes it.
type Node struct {
	Name string `json:"name"`
	// State is Slurm's state, base and flags ("IDLE", "MIXED+DRAIN",
	// "DOWN+NOT_RESPONDING").
	State string `json:"state"`
	// Reason is why an admin or Slurm took the node out (empty when
	// none).
	Reason     string   `json:"reason,omitempty"`
	GPUType    string   `json:"gpu_type,omitempty"`
	GPUs       int      `json:"gpus"`
	CPUs       int      `json:"cpus"`
	MemoryMB   int64    `json:"memory_mb"`
	Features   []string `json:"features,omitempty"`
	Partitions []string `json:"partitions,omitempty"`
	// Addr is the node's NodeAddr: where Slurm, and the other nodes of
	// a gang, reach it (its name need not resolve).
	Addr string `json:"addr,omitempty"`
}

// Gres is the GRES a job asks for to get all of the node's GPUs
// ("gpu:a100:4"); empty when the node has none.
func (n Node) Gres() string {
	switch {
	case n.GPUs == 0:
		return ""
	case n.GPUType == "":
		return fmt.Sprintf("gpu:%d", n.GPUs)
	}
	return fmt.Sprintf("gpu:%s:%d", n.GPUType, n.GPUs)
}

// unusable are the state words that keep a node from being certified:
// Slurm will not start a job there (or an admin asked it not to).
var unusable = []string{"DOWN", "DRAIN", "DRAINED", "DRAINING", "FAIL", "FAILING", "MAINTENANCE", "MAINT", "NOT_RESPONDING", "FUTURE", "UNKNOWN", "REBOOT_REQUESTED", "REBOOT_ISSUED", "POWERED_DOWN", "POWERING_DOWN", "POWER_DOWN", "INVALID_REG", "INVAL"}

// Unavailable says why Slurm will not run jobs on the node, with Slurm's
// own reason; empty when it will.
func (n Node) Unavailable() string {
	var bad []string
	for _, w := range strings.Split(strings.ToUpper(n.State), "+") {
		w = strings.TrimRight(w, "*~#!%$@^-")
		if slices.Contains(unusable, w) {
			bad = append(bad, strings.ToLower(w))
		}
	}
	if len(bad) == 0 {
		return ""
	}
	msg := "slurm node " + n.Name + " is " + strings.Join(bad, "+")
	if n.Reason != "" {
		msg += ": " + n.Reason
	}
	return msg
}

// Nodes returns the compute nodes of the given partitions (all when
// none), each once, in Slurm's order.
func (c *Client) Nodes(ctx context.Context, partitions []string) ([]Node, error) {
	out, err := c.run(ctx, nil, "scontrol", "show", "node", "-o")
	if err != nil {
		return nil, fmt.Errorf("listing slurm nodes: %w", err)
	}
	nodes, err := ParseNodes(out)
	if err != nil {
		return nil, err
	}
	if len(partitions) == 0 {
		return nodes, nil
	}
	var in []Node
	for _, n := range nodes {
		for _, p := range n.Partitions {
			if slices.Contains(partitions, p) {
				in = append(in, n)
				break
			}
		}
	}
	return in, nil
}

// ParseNodes parses `scontrol show node -o`.
func ParseNodes(out string) ([]Node, error) {
	var nodes []Node
	for _, line := range strings.Split(out, "\n") {
		if strings.TrimSpace(line) == "" {
			continue
		}
		f := fields(line)
		name := f["NodeName"]
		if name == "" {
			return nil, fmt.Errorf("parsing scontrol show node: a line without NodeName: %.200q", line)
		}
		n := Node{Name: name, State: f["State"], Reason: f["Reason"]}
		n.GPUType, n.GPUs = parseGres(f["Gres"])
		n.CPUs, _ = strconv.Atoi(f["CPUTot"])
		n.MemoryMB, _ = strconv.ParseInt(f["RealMemory"], 10, 64)
		n.Features = list(f["AvailableFeatures"])
		n.Partitions = list(f["Partitions"])
		n.Addr = f["NodeAddr"]
		nodes = append(nodes, n)
	}
	return nodes, nil
}

func list(v string) []string {
	if v == "" || v == "(null)" {
		return nil
	}
	return strings.Split(v, ",")
}

// parseGres reads the GPUs of a node's Gres ("gpu:a100:4(S:0-1)",
// "gpu:4", "gpu:a100:2,gpu:a100:2"): the first GPU type and the count of
// every gpu entry.
func parseGres(v string) (typ string, count int) {
	if v == "" || v == "(null)" {
		return "", 0
	}
	for _, e := range strings.Split(v, ",") {
		e, _, _ = strings.Cut(e, "(")
		parts := strings.Split(e, ":")
		if parts[0] != "gpu" || len(parts) < 2 {
			continue
		}
		n, err := strconv.Atoi(parts[len(parts)-1])
		if err != nil {
			continue
		}
		if len(parts) >= 3 && typ == "" {
			typ = parts[1]
		}
		count += n
	}
	return typ, count
}
