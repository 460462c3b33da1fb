// Package rendezvous is the environment a run across several nodes gives
// each of its ranks: the variables `python3 -m torch.distributed.run`
// (torchrun) and torch.distributed's init_process_group("env://") read,
// with GPUPASS_* equivalents, from one table. Gang gives them for an
// executor that starts each rank itself (Rank) or one launcher per node
// (Node); SlurmTask gives the same set inside an `srun` task, derived from
// Slurm's own SLURM_* variables.
//
// The package is pure: it dials nothing, resolves no host name and starts
// nothing.
package rendezvous

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/gpupass/gpupass/internal/spec"
)

// Limits on a gang: the spec's bound on resources.nodes, and the ranks
// one node starts.
const (
	MaxNodes      = spec.MaxNodes
	MaxLocalRanks = 64
)

// PodAddress is the job address a Kubernetes agent advertises: its
// ranks run in pods, each with an IP of its own that exists only once
// the pod does, so no address is known when the broker places the gang.
// The agent of each rank puts rank 0's pod IP in its place (rank 0 from
// its own pod's status, the others by waiting for that pod); it is in
// the reserved .invalid domain, so one that reached a job anyway could
// never resolve to somewhere else. Nodes advertising it take a gang only
// with nodes of the same cluster (the same provider), where pod IPs
// reach each other.
const PodAddress = "pod-ip.invalid"

// Gang is one node's view of a run's rendezvous.
type Gang struct {
	// NodeRank is this node's rank, 0 for the node that hosts the
	// rendezvous (MasterAddr).
	NodeRank int
	// Nodes is the gang's node count.
	Nodes int
	// LocalRanks is the processes (ranks) on each node, the same on
	// every node: its GPUs, or 1 without GPUs.
	LocalRanks int
	// MasterAddr and MasterPort are where rank 0 listens: the rank-0
	// node's reachable address (an IP or a host name) and a port of its.
	MasterAddr string
	MasterPort int
}

// Validate says what is wrong with g, naming the field.
func (g Gang) Validate() error {
	var errs []error
	if g.Nodes < 1 || g.Nodes > MaxNodes {
		errs = append(errs, fmt.Errorf("nodes %d: want 1 to %d", g.Nodes, MaxNodes))
	} else if g.NodeRank < 0 || g.NodeRank >= g.Nodes {
		errs = append(errs, fmt.Errorf("node rank %d: want 0 to %d (below nodes %d)", g.NodeRank, g.Nodes-1, g.Nodes))
	}
	if g.LocalRanks < 1 || g.LocalRanks > MaxLocalRanks {
		errs = append(errs, fmt.Errorf("local ranks per node %d: want 1 to %d", g.LocalRanks, MaxLocalRanks))
	}
	if err := CheckAddr(g.MasterAddr); err != nil {
		errs = append(errs, fmt.Errorf("master address: %w", err))
	}
	if err := CheckPort(g.MasterPort); err != nil {
		errs = append(errs, fmt.Errorf("master port: %w", err))
	}
	return errors.Join(errs...)
}

// CheckPort says why p cannot be a rendezvous port.
func CheckPort(p int) error {
	if p < 1 || p > 65535 {
		return fmt.Errorf("%d is not a TCP port (1 to 65535)", p)
	}
	return nil
}

// CheckAddr says why a cannot be a rendezvous address: it must be an IP
// address or a host name (RFC 1123 labels), nothing a shell or a URL
// would read more into.
func CheckAddr(a string) error {
	if a == "" {
		return errors.New("empty: want the rank-0 node's IP address or host name")
	}
	if ip, err := netip.ParseAddr(a); err == nil {
		if ip.Zone() != "" {
			// A zone means one host's interface; the other nodes
			// cannot reach rank 0 by it.
			return fmt.Errorf("%q has an IPv6 zone: give an address the other nodes reach", a)
		}
		return nil
	}
	if len(a) > 253 {
		return fmt.Errorf("%.40q…: a host name has at most 253 characters", a)
	}
	for _, label := range strings.Split(strings.TrimSuffix(a, "."), ".") {
		if !hostLabel(label) {
			return fmt.Errorf("%q is neither an IP address nor a host name (labels of letters, digits and inner hyphens)", a)
		}
	}
	return nil
}

func hostLabel(l string) bool {
	if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
		return false
	}
	for _, r := range l {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// scope is who reads a variable: a launcher per node reads the node ones,
// each rank all of them.
type scope int

const (
	node scope = iota
	rank
)

// variable is one entry of the contract: its name, its value for a rank
// of a Gang, and the same value inside an srun task (a shell expression
// over SLURM_* variables and the gang-wide ones SlurmTask exports).
type variable struct {
	name  string
	scope scope
	value func(g Gang, local int) string
	slurm string
}

func itoa(i int) string { return strconv.Itoa(i) }

// vars is the contract, in the order it is written. The rank-level names
// are the ones torch 1.13's elastic agent (local_elastic_agent.py) sets
// for each worker; PET_* are the environment defaults of torchrun's own
// flags (--nnodes, --node_rank, --nproc_per_node, --master_addr,
// --master_port), so a job that runs torchrun needs none of them.
var vars = []variable{
	{"MASTER_ADDR", node, func(g Gang, _ int) string { return g.MasterAddr }, `$GPUPASS_MASTER_ADDR`},
	{"MASTER_PORT", node, func(g Gang, _ int) string { return itoa(g.MasterPort) }, `$GPUPASS_MASTER_PORT`},
	{"NNODES", node, func(g Gang, _ int) string { return itoa(g.Nodes) }, `$SLURM_NNODES`},
	{"NODE_RANK", node, func(g Gang, _ int) string { return itoa(g.NodeRank) }, `$SLURM_NODEID`},
	{"LOCAL_WORLD_SIZE", node, func(g Gang, _ int) string { return itoa(g.LocalRanks) }, `$((SLURM_NTASKS / SLURM_NNODES))`},
	{"WORLD_SIZE", node, func(g Gang, _ int) string { return itoa(g.Nodes * g.LocalRanks) }, `$SLURM_NTASKS`},
	{"PET_NNODES", node, func(g Gang, _ int) string { return itoa(g.Nodes) }, `$SLURM_NNODES`},
	{"PET_NODE_RANK", node, func(g Gang, _ int) string { return itoa(g.NodeRank) }, `$SLURM_NODEID`},
	{"PET_NPROC_PER_NODE", node, func(g Gang, _ int) string { return itoa(g.LocalRanks) }, `$((SLURM_NTASKS / SLURM_NNODES))`},
	{"PET_MASTER_ADDR", node, func(g Gang, _ int) string { return g.MasterAddr }, `$GPUPASS_MASTER_ADDR`},
	{"PET_MASTER_PORT", node, func(g Gang, _ int) string { return itoa(g.MasterPort) }, `$GPUPASS_MASTER_PORT`},
	{"GPUPASS_MASTER_ADDR", node, func(g Gang, _ int) string { return g.MasterAddr }, `$GPUPASS_MASTER_ADDR`},
	{"GPUPASS_MASTER_PORT", node, func(g Gang, _ int) string { return itoa(g.MasterPort) }, `$GPUPASS_MASTER_PORT`},
	{"GPUPASS_NNODES", node, func(g Gang, _ int) string { return itoa(g.Nodes) }, `$SLURM_NNODES`},
	{"GPUPASS_NODE_RANK", node, func(g Gang, _ int) string { return itoa(g.NodeRank) }, `$SLURM_NODEID`},
	{"GPUPASS_LOCAL_WORLD_SIZE", node, func(g Gang, _ int) string { return itoa(g.LocalRanks) }, `$((SLURM_NTASKS / SLURM_NNODES))`},
	{"GPUPASS_WORLD_SIZE", node, func(g Gang, _ int) string { return itoa(g.Nodes * g.LocalRanks) }, `$SLURM_NTASKS`},

	{"RANK", rank, func(g Gang, l int) string { return itoa(g.NodeRank*g.LocalRanks + l) }, `$SLURM_PROCID`},
	{"LOCAL_RANK", rank, func(_ Gang, l int) string { return itoa(l) }, `$SLURM_LOCALID`},
	{"GROUP_RANK", rank, func(g Gang, _ int) string { return itoa(g.NodeRank) }, `$SLURM_NODEID`},
	{"GROUP_WORLD_SIZE", rank, func(g Gang, _ int) string { return itoa(g.Nodes) }, `$SLURM_NNODES`},
	{"ROLE_RANK", rank, func(g Gang, l int) string { return itoa(g.NodeRank*g.LocalRanks + l) }, `$SLURM_PROCID`},
	{"ROLE_WORLD_SIZE", rank, func(g Gang, _ int) string { return itoa(g.Nodes * g.LocalRanks) }, `$SLURM_NTASKS`},
	{"ROLE_NAME", rank, func(Gang, int) string { return "default" }, `default`},
	{"GPUPASS_RANK", rank, func(g Gang, l int) string { return itoa(g.NodeRank*g.LocalRanks + l) }, `$SLURM_PROCID`},
	{"GPUPASS_LOCAL_RANK", rank, func(_ Gang, l int) string { return itoa(l) }, `$SLURM_LOCALID`},
}

// Names lists every variable a rank gets, in the order Rank writes them.
func Names() []string {
	n := make([]string, len(vars))
	for i, v := range vars {
		n[i] = v.name
	}
	return n
}

// Node is the environment (NAME=value) of one launcher per node, e.g.
// `python3 -m torch.distributed.run train.py`, which reads its flags from
// the PET_* variables and starts LocalRanks ranks itself. It holds no
// per-rank variable (RANK, LOCAL_RANK…): torchrun sets those.
func (g Gang) Node() ([]string, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	var env []string
	for _, v := range vars {
		if v.scope == node {
			env = append(env, v.name+"="+v.value(g, 0))
		}
	}
	return env, nil
}

// Rank is the environment (NAME=value) of the rank with local rank local
// on this node, started by the executor itself: what torchrun would give
// it, so init_process_group("env://") works.
func (g Gang) Rank(local int) ([]string, error) {
	if err := g.Validate(); err != nil {
		return nil, err
	}
	if local < 0 || local >= g.LocalRanks {
		return nil, fmt.Errorf("local rank %d: want 0 to %d (below local ranks per node %d)", local, g.LocalRanks-1, g.LocalRanks)
	}
	env := make([]string, len(vars))
	for i, v := range vars {
		env[i] = v.name + "=" + v.value(g, local)
	}
	return env, nil
}

// slurmMaster finds, in a batch script or an srun task, the address Slurm
// itself reaches the allocation's first node at (its NodeAddr; node names
// need not resolve), unless GPUPASS_MASTER_ADDR is set already.
const slurmMaster = `if [ -z "${GPUPASS_MASTER_ADDR:-}" ]; then
  GPUPASS_MASTER_ADDR=$(scontrol show node -o "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)" | sed -n 's/.* NodeAddr=\([^ ]*\).*/\1/p')
fi
if [ -z "$GPUPASS_MASTER_ADDR" ]; then
  echo "gpupass: no address for the first node of $SLURM_JOB_NODELIST (scontrol show node)" >&2
  exit 1
fi
`

// SlurmTask wraps argv so that each task of `srun -N NODES
// --ntasks-per-node=LOCAL` runs it with the same variables Rank gives,
// taken from the task's SLURM_* variables: MASTER_ADDR is the first node's
// NodeAddr, MASTER_PORT is port. The wrapper is /bin/sh running a fixed
// script; argv is passed as its arguments and exec'd, never parsed.
func SlurmTask(port int, argv []string) ([]string, error) {
	if err := CheckPort(port); err != nil {
		return nil, fmt.Errorf("master port: %w", err)
	}
	if len(argv) == 0 {
		return nil, errors.New("no command to run")
	}
	return append([]string{"/bin/sh", "-c", SlurmTaskScript(port), "gpupass-rank"}, argv...), nil
}

// SlurmTaskScript is the script SlurmTask runs: it exports the contract's
// variables, then execs its arguments.
func SlurmTaskScript(port int) string {
	var b strings.Builder
	b.WriteString("set -e\n")
	b.WriteString(slurmMaster)
	fmt.Fprintf(&b, "GPUPASS_MASTER_PORT=${GPUPASS_MASTER_PORT:-%d}\n", port)
	for _, v := range vars {
		fmt.Fprintf(&b, "%s=\"%s\"; export %s\n", v.name, v.slurm, v.name)
	}
	b.WriteString("exec \"$@\"\n")
	return b.String()
}

// MaxJobPorts bounds a node's job port range: a broker draws one port of
// rank 0's range per gang attempt, and a few hundred leave room for the
// other listeners a job opens.
const MaxJobPorts = 4096

// CheckJobPorts says why lo..hi cannot be a node's job port range (agent
// --job-ports): both TCP ports, lo ≤ hi, at most MaxJobPorts of them.
func CheckJobPorts(lo, hi int) error {
	if err := CheckPort(lo); err != nil {
		return fmt.Errorf("first port: %w", err)
	}
	if err := CheckPort(hi); err != nil {
		return fmt.Errorf("last port: %w", err)
	}
	if hi < lo {
		return fmt.Errorf("%d-%d ends before it starts: want FIRST-LAST, e.g. 29500-29599", lo, hi)
	}
	if hi-lo+1 > MaxJobPorts {
		return fmt.Errorf("%d-%d is %d ports: at most %d", lo, hi, hi-lo+1, MaxJobPorts)
	}
	return nil
}

// ParseJobPorts reads a job port range, "FIRST-LAST" (29500-29599) or
// one port, and checks it (CheckJobPorts).
func ParseJobPorts(s string) (lo, hi int, err error) {
	first, last, ok := strings.Cut(strings.TrimSpace(s), "-")
	if !ok {
		last = first
	}
	if lo, err = strconv.Atoi(strings.TrimSpace(first)); err == nil {
		hi, err = strconv.Atoi(strings.TrimSpace(last))
	}
	if err != nil {
		return 0, 0, fmt.Errorf("%q: want FIRST-LAST, e.g. 29500-29599", s)
	}
	return lo, hi, CheckJobPorts(lo, hi)
}

// InRange reports whether port is in lo..hi: an agent checks the
// rendezvous port a broker gives rank 0 is one of its own.
func InRange(port, lo, hi int) bool { return port >= lo && port <= hi }
