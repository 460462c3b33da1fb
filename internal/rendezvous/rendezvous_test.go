package rendezvous_test

import (
	"os/exec"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpupass/gpupass/internal/rendezvous"
)

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		m[k] = v
	}
	return m
}

func TestRank(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		gang  rendezvous.Gang
		local int
		want  map[string]string
	}{
		{"one node one rank", rendezvous.Gang{NodeRank: 0, Nodes: 1, LocalRanks: 1, MasterAddr: "127.0.0.1", MasterPort: 29500}, 0, map[string]string{
			"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0",
			"NODE_RANK": "0", "NNODES": "1", "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
			"ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1", "ROLE_NAME": "default",
			"PET_NNODES": "1", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "1", "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": "29500",
			"GPUPASS_MASTER_ADDR": "127.0.0.1", "GPUPASS_MASTER_PORT": "29500", "GPUPASS_WORLD_SIZE": "1", "GPUPASS_RANK": "0",
			"GPUPASS_LOCAL_RANK": "0", "GPUPASS_NODE_RANK": "0", "GPUPASS_NNODES": "1", "GPUPASS_LOCAL_WORLD_SIZE": "1",
		}},
		{"second node of two, 4 GPUs each, local rank 3", rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 4, MasterAddr: "node-0.gang.svc", MasterPort: 40001}, 3, map[string]string{
			"MASTER_ADDR": "node-0.gang.svc", "MASTER_PORT": "40001", "WORLD_SIZE": "8", "RANK": "7", "LOCAL_RANK": "3",
			"NODE_RANK": "1", "NNODES": "2", "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2",
			"ROLE_RANK": "7", "ROLE_WORLD_SIZE": "8", "ROLE_NAME": "default",
			"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "4", "PET_MASTER_ADDR": "node-0.gang.svc", "PET_MASTER_PORT": "40001",
			"GPUPASS_MASTER_ADDR": "node-0.gang.svc", "GPUPASS_MASTER_PORT": "40001", "GPUPASS_WORLD_SIZE": "8", "GPUPASS_RANK": "7",
			"GPUPASS_LOCAL_RANK": "3", "GPUPASS_NODE_RANK": "1", "GPUPASS_NNODES": "2", "GPUPASS_LOCAL_WORLD_SIZE": "4",
		}},
		{"IPv6 master", rendezvous.Gang{NodeRank: 2, Nodes: 3, LocalRanks: 2, MasterAddr: "fd00::1", MasterPort: 65535}, 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			env, err := tc.gang.Rank(tc.local)
			if err != nil {
				t.Fatal(err)
			}
			got := envMap(env)
			if len(got) != len(env) {
				t.Errorf("a variable is written twice: %q", env)
			}
			if tc.want != nil {
				if d := cmp.Diff(tc.want, got); d != "" {
					t.Errorf("Rank(%d) (-want +got):\n%s", tc.local, d)
				}
			}
			if got["RANK"] != got["GPUPASS_RANK"] || got["WORLD_SIZE"] != got["ROLE_WORLD_SIZE"] || got["MASTER_ADDR"] != tc.gang.MasterAddr {
				t.Errorf("inconsistent: %v", got)
			}
			names := rendezvous.Names()
			sort.Strings(names)
			keys := make([]string, 0, len(got))
			for k := range got {
				keys = append(keys, k)
			}
			sort.Strings(keys)
			if d := cmp.Diff(names, keys); d != "" {
				t.Errorf("Names() and Rank's variables differ (-names +rank):\n%s", d)
			}
		})
	}
}

// TestNodeHasNoRankVariables: a launcher (torchrun) per node gets the
// gang-wide variables, and none that would give every rank it starts the
// same RANK.
func TestNodeHasNoRankVariables(t *testing.T) {
	t.Parallel()
	env, err := rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 2, MasterAddr: "10.0.0.5", MasterPort: 29500}.Node()
	if err != nil {
		t.Fatal(err)
	}
	got := envMap(env)
	for _, k := range []string{"RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "GPUPASS_RANK", "GPUPASS_LOCAL_RANK"} {
		if _, ok := got[k]; ok {
			t.Errorf("Node() sets %s: %v", k, env)
		}
	}
	for k, want := range map[string]string{"PET_NNODES": "2", "PET_NODE_RANK": "1", "PET_NPROC_PER_NODE": "2", "PET_MASTER_ADDR": "10.0.0.5",
		"PET_MASTER_PORT": "29500", "WORLD_SIZE": "4", "NNODES": "2", "NODE_RANK": "1"} {
		if got[k] != want {
			t.Errorf("Node() %s=%q, want %q", k, got[k], want)
		}
	}
}

func TestValidate(t *testing.T) {
	t.Parallel()
	ok := rendezvous.Gang{NodeRank: 0, Nodes: 2, LocalRanks: 1, MasterAddr: "127.0.0.1", MasterPort: 29500}
	for _, tc := range []struct {
		name   string
		change func(*rendezvous.Gang)
		local  int
		want   string // "" for valid
	}{
		{"valid", func(*rendezvous.Gang) {}, 0, ""},
		{"host name", func(g *rendezvous.Gang) { g.MasterAddr = "agt-1.us-west-2.example" }, 0, ""},
		{"trailing dot", func(g *rendezvous.Gang) { g.MasterAddr = "n1." }, 0, ""},
		{"rank equal to nodes", func(g *rendezvous.Gang) { g.NodeRank = 2 }, 0, "node rank 2: want 0 to 1 (below nodes 2)"},
		{"negative rank", func(g *rendezvous.Gang) { g.NodeRank = -1 }, 0, "node rank -1"},
		{"no nodes", func(g *rendezvous.Gang) { g.Nodes = 0 }, 0, "nodes 0: want 1 to 1024"},
		{"too many nodes", func(g *rendezvous.Gang) { g.Nodes = 1025 }, 0, "nodes 1025"},
		{"no local ranks", func(g *rendezvous.Gang) { g.LocalRanks = 0 }, 0, "local ranks per node 0: want 1 to 64"},
		{"local rank out of range", func(*rendezvous.Gang) {}, 1, "local rank 1: want 0 to 0"},
		{"port 0", func(g *rendezvous.Gang) { g.MasterPort = 0 }, 0, "master port: 0 is not a TCP port (1 to 65535)"},
		{"port too big", func(g *rendezvous.Gang) { g.MasterPort = 65536 }, 0, "master port: 65536 is not a TCP port"},
		{"empty address", func(g *rendezvous.Gang) { g.MasterAddr = "" }, 0, "master address: empty"},
		{"address with a port", func(g *rendezvous.Gang) { g.MasterAddr = "10.0.0.1:29500" }, 0, "neither an IP address nor a host name"},
		{"address with a shell word", func(g *rendezvous.Gang) { g.MasterAddr = "n1;reboot" }, 0, "neither an IP address nor a host name"},
		{"address with a space", func(g *rendezvous.Gang) { g.MasterAddr = "n1 n2" }, 0, "neither an IP address nor a host name"},
		{"label starting with a hyphen", func(g *rendezvous.Gang) { g.MasterAddr = "-n1" }, 0, "neither an IP address nor a host name"},
		{"URL", func(g *rendezvous.Gang) { g.MasterAddr = "tcp://n1" }, 0, "neither an IP address nor a host name"},
		{"IPv6 with a zone", func(g *rendezvous.Gang) { g.MasterAddr = "fe80::1%eth0" }, 0, "has an IPv6 zone"},
		{"bracketed IPv6", func(g *rendezvous.Gang) { g.MasterAddr = "[fd00::1]" }, 0, "neither an IP address nor a host name"},
		{"several at once", func(g *rendezvous.Gang) { g.Nodes, g.MasterPort = 0, -1 }, 0, "nodes 0: want 1 to 1024\nmaster port: -1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := ok
			tc.change(&g)
			_, err := g.Rank(tc.local)
			if tc.want == "" {
				if err != nil {
					t.Fatalf("Rank: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Rank: %v, want an error containing %q", err, tc.want)
			}
			if tc.local == 0 {
				if _, nerr := g.Node(); nerr == nil {
					t.Errorf("Node accepted what Rank refused (%v)", err)
				}
			}
		})
	}
}

// TestSlurmTaskMatchesRank runs the script SlurmTask wraps a command in,
// with the SLURM_* variables srun gives task 5 of `srun -N 2
// --ntasks-per-node=4`, and expects exactly the environment Rank gives
// that rank: the shell column of the contract agrees with the Go one.
func TestSlurmTaskMatchesRank(t *testing.T) {
	t.Parallel()
	argv, err := rendezvous.SlurmTask(29511, []string{"/usr/bin/env"})
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	// The master address comes from scontrol on a real cluster; preset,
	// the script keeps it.
	cmd.Env = []string{"PATH=/usr/bin:/bin", "SLURM_NNODES=2", "SLURM_NODEID=1", "SLURM_NTASKS=8", "SLURM_PROCID=5",
		"SLURM_LOCALID=1", "SLURM_JOB_NODELIST=n[1-2]", "GPUPASS_MASTER_ADDR=127.0.0.1"}
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	got := envMap(strings.Split(strings.TrimSpace(string(out)), "\n"))
	want, err := rendezvous.Gang{NodeRank: 1, Nodes: 2, LocalRanks: 4, MasterAddr: "127.0.0.1", MasterPort: 29511}.Rank(1)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range envMap(want) {
		if got[k] != v {
			t.Errorf("in the srun task %s=%q, Rank gives %q", k, got[k], v)
		}
	}
}

func TestSlurmTaskRefuses(t *testing.T) {
	t.Parallel()
	if _, err := rendezvous.SlurmTask(0, []string{"true"}); err == nil || !strings.Contains(err.Error(), "master port: 0 is not a TCP port") {
		t.Errorf("port 0: %v", err)
	}
	if _, err := rendezvous.SlurmTask(29500, nil); err == nil {
		t.Error("no command: no error")
	}
}
