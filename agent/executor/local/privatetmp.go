package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// PrivateTmp gives every run of the local executor a /tmp, /var/tmp and
// /dev/shm of its own, as systemd's PrivateTmp= does for a service: the
// run's processes start in a mount namespace of the run's, where /tmp and
// /var/tmp are the run's TMPDIR (on disk, under the state dir, removed
// with the run; $TMPDIR says /tmp) and /dev/shm is a fresh tmpfs. What
// one run leaves there never reaches the node's dirs, so the next run, as
// the same --run-as user, finds nothing of it; the tmpfs is unmounted,
// and its memory freed, once the run's processes are gone.
//
// The namespace's mounts are slaves of the node's: a file system the node
// mounts later shows up in the run, and nothing the run's namespace
// mounts (a job has no privilege to mount; root has set it up) propagates
// back. Slave rather than private: a private copy would keep every mount
// of the node busy in the run's namespace, so the node could not unmount
// a file system while a run goes on.
//
// Only the local executor (ProcessRunner) uses it. A Slurm batch job
// runs on a compute node under slurmd (Slurm's job_container/tmpfs
// plugin does this there, where the cluster enables it), and a
// Kubernetes pod already has a /tmp and /dev/shm of its own.
type PrivateTmp struct {
	// ShmSize is the size= of each run's /dev/shm tmpfs (default
	// DefaultShmSize): a tmpfs's pages are RAM, charged (with a memory
	// controller) to the cgroup of the process that writes them.
	ShmSize string
	// Keep are dirs below /tmp, /var/tmp or /dev/shm that runs still
	// see at their paths (the agent's state dir, when an operator put it
	// there: the runs' work dirs and bundle venvs are in it). The run's
	// work root is always kept.
	Keep []string
}

// DefaultShmSize is PrivateTmp.ShmSize's default (--run-shm-size): half
// the node's RAM, as the kernel sizes a tmpfs without size= and most
// distributions size the node's own /dev/shm, so training that works on
// the node (PyTorch's DataLoader workers hand batches over in /dev/shm)
// works in a run.
const DefaultShmSize = "50%"

// CheckShmSize returns an error unless s is a tmpfs size= value: a number
// of bytes with an optional k, m, g or t suffix, or a percentage of RAM
// from 1% to 100%.
func CheckShmSize(s string) error {
	num, suffix := s, ""
	if i := strings.IndexAny(s, "kKmMgGtT%"); i >= 0 {
		num, suffix = s[:i], s[i:]
	}
	n, err := strconv.ParseUint(num, 10, 64)
	switch {
	case err != nil || len(suffix) > 1:
		return errors.New("not a size: want bytes with an optional k, m, g or t suffix (e.g. 16g), or a percentage of RAM (e.g. 50%)")
	case n == 0:
		return errors.New("must be more than 0: a run could not use /dev/shm at all")
	case suffix == "%" && n > 100:
		return errors.New("must be at most 100% of RAM")
	}
	return nil
}

// privateTmpDirs are where a run gets dirs of its own: the first two are
// the run's TMPDIR, the last a tmpfs.
var privateTmpDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// DetectPrivateTmp checks that the agent can give runs a mount namespace
// (root, mount namespaces allowed, no seccomp filter against unshare) by
// making a trial one over dir, a directory of the agent's; the error says
// why not.
func DetectPrivateTmp(p PrivateTmp, dir string) error {
	if err := CheckShmSize(p.shmSize()); err != nil {
		return err
	}
	t, err := p.new("probe-"+strconv.Itoa(os.Getpid()), dir, nil)
	if err != nil {
		return err
	}
	return t.Close()
}

// String says what runs get, for the agent's log and a run's start event.
func (p PrivateTmp) String() string {
	return "mount namespace: /tmp and /var/tmp the run's TMPDIR, /dev/shm a tmpfs of size=" + p.shmSize()
}

func (p PrivateTmp) shmSize() string {
	if p.ShmSize == "" {
		return DefaultShmSize
	}
	return p.ShmSize
}

// runTmp is one run's mount namespace, held open by a file descriptor of
// it: the threads that start the run's processes enter it (enter).
type runTmp struct {
	fd  int
	tag string
}

// new makes a run's mount namespace: /tmp and /var/tmp are tmpDir (the
// run's TMPDIR), /dev/shm a fresh tmpfs named gpupass-<tag> (so it can be
// found in /proc/*/mountinfo), and the dirs of keep that lie below
// those are bind-mounted back at their paths. It runs on a thread of
// its own, which the namespace ends with; the returned runTmp holds it.
func (p PrivateTmp) new(tag, tmpDir string, keep []string) (*runTmp, error) {
	type result struct {
		t   *runTmp
		err error
	}
	ch := make(chan result, 1)
	go func() {
		// Never unlocked: the thread leaves the agent's mount
		// namespace, so it must not serve any other goroutine; the Go
		// runtime ends a thread whose goroutine exits locked.
		runtime.LockOSThread()
		t, err := p.setUp(tag, tmpDir, keep)
		ch <- result{t, err}
	}()
	r := <-ch
	if r.err != nil {
		return nil, fmt.Errorf("giving the run a private /tmp and /dev/shm: %w", r.err)
	}
	return r.t, nil
}

// setUp does new's work on the locked thread.
func (p PrivateTmp) setUp(tag, tmpDir string, keep []string) (*runTmp, error) {
	if err := syscall.Unshare(syscall.CLONE_NEWNS); err != nil {
		return nil, fmt.Errorf("unshare(CLONE_NEWNS): %w (the agent needs root, and a container must allow mount namespaces)", err)
	}
	if err := syscall.Mount("", "/", "", syscall.MS_REC|syscall.MS_SLAVE, ""); err != nil {
		return nil, fmt.Errorf("making the run's mounts slaves of the node's: %w", err)
	}
	// Opened in the run's namespace (a bind mount takes its source from
	// there) before anything is mounted over them: afterwards the paths
	// lead into the run's dirs.
	type kept struct {
		fd   int
		path string
	}
	var keeps []kept
	defer func() {
		for _, k := range keeps {
			syscall.Close(k.fd)
		}
	}()
	src, err := syscall.Open(tmpDir, unix.O_PATH|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the run's TMPDIR %s: %w", tmpDir, err)
	}
	keeps = append(keeps, kept{src, tmpDir})
	for _, k := range keepBelowTmp(keep) {
		fd, err := syscall.Open(k, unix.O_PATH|syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("opening %s, which runs keep seeing: %w", k, err)
		}
		keeps = append(keeps, kept{fd, k})
	}
	viaFD := func(fd int) string { return "/proc/thread-self/fd/" + strconv.Itoa(fd) }
	for _, d := range privateTmpDirs {
		if fi, err := os.Stat(d); err != nil || !fi.IsDir() {
			continue // not on this node
		}
		if d == "/dev/shm" {
			opts := "mode=1777,size=" + p.shmSize()
			if err := syscall.Mount("gpupass-"+tag, d, "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, opts); err != nil {
				return nil, fmt.Errorf("mounting a tmpfs (%s) at %s: %w", opts, d, err)
			}
			continue
		}
		if err := syscall.Mount(viaFD(src), d, "", syscall.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("mounting the run's TMPDIR at %s: %w", d, err)
		}
	}
	for _, k := range keeps[1:] {
		// The dirs it is reached by are made in the run's TMPDIR or
		// tmpfs, which go with the run.
		if err := os.MkdirAll(k.path, 0o755); err != nil {
			return nil, fmt.Errorf("making %s in the run's /tmp: %w", k.path, err)
		}
		if err := syscall.Mount(viaFD(k.fd), k.path, "", syscall.MS_BIND, ""); err != nil {
			return nil, fmt.Errorf("mounting %s in the run's /tmp: %w", k.path, err)
		}
	}
	fd, err := syscall.Open("/proc/thread-self/ns/mnt", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening the run's mount namespace: %w", err)
	}
	return &runTmp{fd: fd, tag: tag}, nil
}

// keepBelowTmp returns the dirs of keep (symbolic links resolved) that
// lie below /tmp, /var/tmp or /dev/shm, where the run's own dirs would
// hide them; those dirs themselves are never kept, as that would be the
// node's.
func keepBelowTmp(keep []string) []string {
	var out []string
	for _, k := range keep {
		k, err := filepath.EvalSymlinks(k)
		if err != nil || !filepath.IsAbs(k) {
			continue
		}
		for _, d := range privateTmpDirs {
			if rel, err := filepath.Rel(d, k); err == nil && rel != "." && rel != ".." && !strings.HasPrefix(rel, "../") {
				out = append(out, k)
			}
		}
	}
	return out
}

// enter moves the calling thread, which the caller has locked and never
// unlocks, into the run's mount namespace.
func (t *runTmp) enter() error {
	// setns refuses a thread that shares its root and cwd with others.
	if err := syscall.Unshare(syscall.CLONE_FS); err != nil {
		return fmt.Errorf("unshare(CLONE_FS): %w", err)
	}
	if err := unix.Setns(t.fd, unix.CLONE_NEWNS); err != nil {
		return fmt.Errorf("entering the run's mount namespace: %w", err)
	}
	return nil
}

// Close unmounts the run's /dev/shm and its view of /tmp, which frees the
// tmpfs's memory once no process of the run holds a file there (all are
// gone by now), and lets go of the namespace.
func (t *runTmp) Close() error {
	if t == nil || t.fd < 0 {
		return nil
	}
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked, as in new
		if err := t.enter(); err != nil {
			errc <- err
			return
		}
		var errs []error
		for _, d := range privateTmpDirs {
			// Detached: the kernel frees it once unused; EINVAL is a
			// dir that got no mount (not on this node).
			if err := syscall.Unmount(d, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting the run's %s: %w", d, err))
			}
		}
		errc <- errors.Join(errs...)
	}()
	err := <-errc
	if cerr := syscall.Close(t.fd); err == nil {
		err = cerr
	}
	t.fd = -1
	return err
}

// startIn runs start on a thread in the run's mount namespace (and, with
// g, in its cgroup). The thread stays for as long as the started process
// may live, as Pdeathsig follows the thread that forked: release, called
// once the process is gone, ends it.
func (t *runTmp) startIn(g *Cgroup, attr *syscall.SysProcAttr, start func() error) (release func(), err error) {
	errc, done := make(chan error, 1), make(chan struct{})
	go func() {
		runtime.LockOSThread() // never unlocked, as in new
		if err := t.enter(); err != nil {
			errc <- err
			return
		}
		err := g.lockedStart(attr, start)
		errc <- err
		if err == nil {
			<-done
		}
	}()
	if err := <-errc; err != nil {
		return func() {}, err
	}
	return func() { close(done) }, nil
}
