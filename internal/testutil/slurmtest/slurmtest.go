// Package slurmtest starts a real Slurm cluster on this machine for tests:
// munged as the munge user with a private key and socket, slurmctld and
// two slurmd daemons (slurmd -N NAME) on free loopback ports, with
// different GPU GRES (n1: gpu:a100:4, n2: gpu:h100:2; gres.conf File=
// points at plain files, so no GPU is needed), state, spool and logs in a
// temporary directory. The private munge socket (AuthInfo=socket=…) keeps
// test binaries that run at once, and a munged the machine may run, apart.
// One cluster is shared per test binary; stop it from TestMain:
//
//	func TestMain(m *testing.M) { os.Exit(slurmtest.Run(m)) }
//
// With CI=true a missing Slurm or munge fails the test (testutil.Missing).
package slurmtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gpupass/gpupass/internal/testutil"
)

// Partition is the cluster's one partition; ClusterName its name.
const (
	Partition   = "gpu"
	ClusterName = "gptest"
)

// Node is one compute node of the test cluster.
type Node struct {
	Name    string
	GPUType string
	GPUs    int
}

// Nodes are the cluster's compute nodes.
var Nodes = []Node{{"n1", "a100", 4}, {"n2", "h100", 2}}

// Cluster is a running test cluster.
type Cluster struct {
	Dir string
	// Conf is the slurm.conf path: SLURM_CONF for every client command.
	Conf string
	// Shared is a directory every node sees (the same machine), writable
	// by everyone like a cluster's scratch file system.
	Shared string

	missing string
	err     error
	procs   []*exec.Cmd
}

var (
	once   sync.Once
	shared *Cluster
)

// Run runs the tests and stops the shared cluster afterwards.
func Run(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	return code
}

// Shared returns the test binary's cluster, starting it on first use.
func Shared(t testing.TB) *Cluster {
	t.Helper()
	once.Do(func() { shared = start() })
	if shared.missing != "" {
		testutil.Missing(t, "%s", shared.missing)
	}
	if shared.err != nil {
		t.Fatalf("starting the Slurm test cluster: %v", shared.err)
	}
	return shared
}

// Env is the environment a Slurm client command needs: the process's
// own with SLURM_CONF pointing at this cluster.
func (c *Cluster) Env() []string { return append(os.Environ(), "SLURM_CONF="+c.Conf) }

// Command runs a Slurm client tool against the cluster and returns its
// combined output; a failure fails the test.
func (c *Cluster) Command(t testing.TB, name string, args ...string) string {
	t.Helper()
	out, err := c.run(name, args...)
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return out
}

func (c *Cluster) run(name string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = c.Env()
	b, err := cmd.CombinedOutput()
	return string(b), err
}

func free() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func start() *Cluster {
	c := &Cluster{}
	c.missing = testutil.Prereqs{Root: "the Slurm test cluster needs root (munged runs as munge, slurmd as root)",
		Tools:   []string{"munged", "mungekey", "slurmctld", "slurmd", "sbatch", "sinfo", "scontrol", "scancel", "squeue", "srun"},
		Install: "scripts/setup.d/60-slurm.sh installs slurmctld slurmd slurm-client munge"}.Missing()
	if c.missing != "" {
		return c
	}
	mu, err := user.Lookup("munge")
	if err != nil {
		c.missing = "no munge user to run munged as"
		return c
	}
	// The daemons' ports are picked free, then closed for them to bind:
	// on a busy machine another process can take one in between (CI
	// saw "Error binding slurm stream socket: Address already in use").
	// That cluster is stopped and one on other ports started.
	for try := 1; ; try++ {
		c.err = c.boot(mu)
		if c.err == nil || try == 3 || !strings.Contains(c.err.Error(), "Address already in use") {
			return c
		}
		c.stop()
		c = &Cluster{}
	}
}

func sbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/sbin/" + name
}

func (c *Cluster) boot(mu *user.User) error {
	dir, err := testutil.ProcessTempDir("slurmtest-")
	if err != nil {
		return err
	}
	c.Dir = dir
	// munged must reach its own files through dir.
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	uid, _ := strconv.Atoi(mu.Uid)
	gid, _ := strconv.Atoi(mu.Gid)
	mdir := filepath.Join(dir, "munge")
	if err := os.Mkdir(mdir, 0o711); err != nil {
		return err
	}
	if err := os.Chown(mdir, uid, gid); err != nil {
		return err
	}
	asMunge := func(name string, args ...string) *exec.Cmd {
		cmd := exec.Command(sbin(name), args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		return cmd
	}
	key := filepath.Join(mdir, "munge.key")
	if out, err := asMunge("mungekey", "-c", "-k", key).CombinedOutput(); err != nil {
		return fmt.Errorf("mungekey: %v: %s", err, out)
	}
	sock := filepath.Join(mdir, "munge.socket")
	if err := c.daemon("munged", asMunge("munged", "-F", "--socket="+sock, "--key-file="+key,
		"--log-file="+filepath.Join(mdir, "munged.log"), "--pid-file="+filepath.Join(mdir, "munged.pid"),
		"--seed-file="+filepath.Join(mdir, "munged.seed"))); err != nil {
		return err
	}
	if err := waitFor(10*time.Second, func() error { _, err := os.Stat(sock); return err }); err != nil {
		return fmt.Errorf("munged did not make its socket: %w", err)
	}

	c.Shared = filepath.Join(dir, "shared")
	for _, d := range []string{"ctld", "log", "gpus", "shared", "n1", "n2"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			return err
		}
	}
	if err := os.Chmod(c.Shared, 0o1777); err != nil {
		return err
	}
	ports := make([]int, 2+len(Nodes))
	for i := range ports {
		if ports[i], err = free(); err != nil {
			return err
		}
	}
	var conf, gres bytes.Buffer
	fmt.Fprintf(&conf, `ClusterName=%s
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=%d
SlurmdPort=%d
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=%s
CredType=cred/munge
StateSaveLocation=%s/ctld
SlurmdSpoolDir=%s/%%n
SlurmctldPidFile=%s/ctld/slurmctld.pid
SlurmdPidFile=%s/%%n/slurmd.pid
SlurmctldLogFile=%s/log/slurmctld.log
SlurmdLogFile=%s/log/%%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=1
GresTypes=gpu
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=2
MinJobAge=600
SlurmdParameters=config_overrides
`, ClusterName, ports[0], ports[1], sock, dir, dir, dir, dir, dir, dir)
	names := make([]string, len(Nodes))
	for i, n := range Nodes {
		names[i] = n.Name
		// CPUs=4 each (config_overrides: whatever this machine has): a node
		// takes several tiny jobs at once.
		fmt.Fprintf(&conf, "NodeName=%s NodeHostname=localhost NodeAddr=127.0.0.1 Port=%d CPUs=4 RealMemory=1000 Gres=gpu:%s:%d Feature=%s\n",
			n.Name, ports[2+i], n.GPUType, n.GPUs, n.GPUType)
		for g := 0; g < n.GPUs; g++ {
			if err := os.WriteFile(filepath.Join(dir, "gpus", fmt.Sprintf("%s-%d", n.Name, g)), nil, 0o644); err != nil {
				return err
			}
		}
		fmt.Fprintf(&gres, "NodeName=%s Name=gpu Type=%s File=%s/gpus/%s-[0-%d]\n", n.Name, n.GPUType, dir, n.Name, n.GPUs-1)
	}
	fmt.Fprintf(&conf, "PartitionName=%s Nodes=%s Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n", Partition, strings.Join(names, ","))
	c.Conf = filepath.Join(dir, "slurm.conf")
	if err := os.WriteFile(c.Conf, conf.Bytes(), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile(filepath.Join(dir, "gres.conf"), gres.Bytes(), 0o644); err != nil {
		return err
	}
	ctld := exec.Command(sbin("slurmctld"), "-D", "-i")
	ctld.Env = c.Env()
	if err := c.daemon("slurmctld", ctld); err != nil {
		return err
	}
	for _, n := range Nodes {
		d := exec.Command(sbin("slurmd"), "-D", "-N", n.Name)
		d.Env = c.Env()
		if err := c.daemon("slurmd "+n.Name, d); err != nil {
			return err
		}
	}
	err = waitFor(60*time.Second, func() error {
		out, err := c.run("sinfo", "-h", "-N", "-o", "%N %t")
		if err != nil {
			return fmt.Errorf("%v: %s", err, out)
		}
		idle := 0
		for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
			if f := strings.Fields(l); len(f) == 2 && f[1] == "idle" {
				idle++
			}
		}
		if idle != len(Nodes) {
			return fmt.Errorf("nodes not idle yet: %q", out)
		}
		return nil
	})
	if err != nil {
		logs, _ := os.ReadFile(filepath.Join(dir, "log", "slurmctld.log"))
		return fmt.Errorf("cluster not up: %w\n%s", err, tail(logs, 2000))
	}
	return nil
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func (c *Cluster) daemon(name string, cmd *exec.Cmd) error {
	logf, err := os.Create(filepath.Join(c.Dir, strings.ReplaceAll(name, " ", "-")+".out"))
	if err != nil {
		return err
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	// A group of its own: a Ctrl-C in the terminal goes to the tests,
	// which then stop the daemons in order.
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = true
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("starting %s: %w", name, err)
	}
	logf.Close()
	c.procs = append(c.procs, cmd)
	return nil
}

func waitFor(d time.Duration, f func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// stop cancels every job (their slurmstepd outlive slurmd otherwise),
// then stops the daemons it started, by PID, newest first.
func (c *Cluster) stop() {
	if c.err == nil && c.missing == "" && len(c.procs) > 0 {
		_, _ = c.run("scancel", "--partition="+Partition)
		_ = waitFor(10*time.Second, func() error {
			out, err := c.run("squeue", "-h", "-t", "all", "-o", "%T")
			if err != nil {
				return err
			}
			for _, s := range strings.Fields(out) {
				if s == "RUNNING" || s == "COMPLETING" || s == "PENDING" {
					return errors.New("jobs left")
				}
			}
			return nil
		})
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		p := c.procs[i]
		_ = p.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = p.Process.Kill()
			<-done
		}
	}
	if c.Dir != "" {
		_ = os.RemoveAll(c.Dir)
	}
}
