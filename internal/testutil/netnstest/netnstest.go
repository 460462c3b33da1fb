// Package netnstest gives a test an address that is not loopback and
// that nothing outside the test can reach: a network namespace of its
// own, joined to the test's by a veth pair with addresses in 198.18.0.0/15
// (RFC 2544's benchmark range, never routed), removed when the test ends.
// It needs root and iproute2's `ip`; without them the test stops as
// testutil.Missing says (a failure with CI=true).
package netnstest

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/gpupass/gpupass/internal/testutil"
)

// NS is a network namespace with one veth link to the test's own.
type NS struct {
	// Name is the namespace's name (ip netns).
	Name string
	// HostIP is this side's address of the link, PeerIP the
	// namespace's: both in 198.18.0.0/15, neither loopback.
	HostIP, PeerIP string
}

var seq atomic.Int32

// New creates the namespace and its link, and removes both when t ends.
func New(t testing.TB) *NS {
	t.Helper()
	testutil.NeedRoot(t)
	ipBin := testutil.Tool(t, "ip")
	// A /30 per namespace, spread by pid so that test processes running
	// at once (several packages) do not pick the same one.
	pid, n := os.Getpid(), int(seq.Add(1))
	k := (pid%512)*64 + n%64
	b2, b3, b4 := 18+k/(256*64), (k/64)%256, (k%64)*4
	ns := &NS{
		Name:   fmt.Sprintf("gpupass-test-%d-%d", pid, n),
		HostIP: fmt.Sprintf("198.%d.%d.%d", b2, b3, b4+1),
		PeerIP: fmt.Sprintf("198.%d.%d.%d", b2, b3, b4+2),
	}
	host, peer := fmt.Sprintf("gpv%dh%d", pid%100000, n%100), fmt.Sprintf("gpv%dp%d", pid%100000, n%100)
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(ipBin, args...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
	ip("netns", "add", ns.Name)
	t.Cleanup(func() {
		_ = exec.Command(ipBin, "netns", "del", ns.Name).Run()
		_ = exec.Command(ipBin, "link", "del", host).Run() // gone with its peer already, normally
	})
	ip("link", "add", host, "type", "veth", "peer", "name", peer)
	ip("link", "set", peer, "netns", ns.Name)
	ip("addr", "add", ns.HostIP+"/30", "dev", host)
	ip("link", "set", host, "up")
	ip("-n", ns.Name, "addr", "add", ns.PeerIP+"/30", "dev", peer)
	ip("-n", ns.Name, "link", "set", peer, "up")
	ip("-n", ns.Name, "link", "set", "lo", "up")
	return ns
}

// Listen returns a TCP listener on PeerIP:port (0: any free port) inside
// the namespace: a server the test reaches only over the veth link, as a
// remote host. It is closed when t ends.
func (ns *NS) Listen(t testing.TB, port int) net.Listener {
	t.Helper()
	type result struct {
		ln  net.Listener
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// The socket is made in the namespace of the thread that makes
		// it, and stays there. The thread is never unlocked: it ends with
		// this goroutine, so no other goroutine runs in the namespace.
		runtime.LockOSThread()
		f, err := os.Open("/run/netns/" + ns.Name)
		if err != nil {
			ch <- result{err: err}
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- result{err: fmt.Errorf("setns %s: %w", ns.Name, err)}
			return
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(ns.PeerIP, fmt.Sprint(port)))
		ch <- result{ln, err}
	}()
	r := <-ch
	if r.err != nil {
		t.Fatalf("listening in network namespace %s: %v", ns.Name, r.err)
	}
	t.Cleanup(func() { r.ln.Close() })
	return r.ln
}
