//go:build linux || darwin

package localstack

import (
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestLockState: a held state dir is refused naming the holder's pid and
// URL and a free sibling; released, it is taken again.
func TestLockState(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := lockState(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.write(lockInfo{PID: os.Getpid(), URL: "http://127.0.0.1:7070"}); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir+"-2", 0o700); err != nil {
		t.Fatal(err)
	}
	_, err = lockState(dir)
	var re *RunningError
	if !errors.As(err, &re) || re.PID != os.Getpid() || re.URL != "http://127.0.0.1:7070" || re.Dir != dir || re.Other != dir+"-3" {
		t.Fatalf("second lock: %#v (%v), want a RunningError naming pid %d, the URL and %s-3", re, err, os.Getpid(), dir)
	}
	l.release()
	if b, _ := os.ReadFile(filepath.Join(dir, LockFile)); len(b) != 0 {
		t.Errorf("released lock still names %s", b)
	}
	l2, err := lockState(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l2.release()
}

// A child forked by another goroutine while the stack ran holds the lock
// file's open description until its exec; release must free the lock
// all the same (the dup here stands for that child's copy). With only a
// close, TestLockState failed under load: "state dir … is in use by a
// running stack (pid 0, …)".
func TestReleaseWithAnotherHolderOfTheFile(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	l, err := lockState(dir)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := syscall.Dup(int(l.f.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(fd)
	l.release()
	l2, err := lockState(dir)
	if err != nil {
		t.Fatalf("lock after release, the file still open elsewhere: %v", err)
	}
	l2.release()
}
