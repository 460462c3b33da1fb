//go:build linux || darwin

package localstack

import (
	"errors"
	"os"
	"syscall"
)

// tryLock takes f's exclusive flock without waiting: false when another
// process holds it.
func tryLock(f *os.File) (bool, error) {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		switch {
		case err == nil:
			return true, nil
		case errors.Is(err, syscall.EWOULDBLOCK):
			return false, nil
		case errors.Is(err, syscall.EINTR):
			continue
		}
		return false, err
	}
}

// unlock drops f's flock now. Closing f alone is not enough: a child
// forked meanwhile by another goroutine (exec'ing a command, as up does)
// holds the same open file, and with it the lock, until its exec closes
// it, so a stack started just after this one stopped was refused.
func unlock(f *os.File) { _ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN) }
