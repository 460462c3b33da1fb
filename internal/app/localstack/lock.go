package localstack

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
)

// LockFile is the lock's name inside the state dir: `up` holds it for
// its lifetime, and it names up's pid and the broker's URL.
const LockFile = "up.lock"

// RunningError is the refusal of a second stack on a state dir whose
// first one runs: both would serve the same SQLite file with the same
// agent keys, and the second's config.json would point every command at
// a dead port once it stopped.
type RunningError struct {
	Dir string
	// PID is the running up's process (0: not written yet), URL its
	// broker's ("" before the broker listens).
	PID int
	URL string
	// Other is a state dir no stack holds, for a second stack.
	Other string
}

func (e *RunningError) Error() string {
	url := e.URL
	if url == "" {
		url = "not listening yet"
	}
	return fmt.Sprintf("state dir %s is in use by a running stack (pid %d, URL %s)", e.Dir, e.PID, url)
}

// lockInfo is the lock file's content.
type lockInfo struct {
	PID int    `json:"pid"`
	URL string `json:"url,omitempty"`
}

// stateLock is the held lock of a state dir; the kernel releases it when
// the process ends, however it ends.
type stateLock struct{ f *os.File }

// lockState takes dir's lock or returns a *RunningError naming the stack
// that holds it. The file is opened close-on-exec (os.OpenFile always
// is): the broker and agents must not inherit it, or the lock would
// outlive an up that died.
func lockState(dir string) (*stateLock, error) {
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", path, err)
	}
	held, err := tryLock(f)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("locking %s: %w", path, err)
	}
	if !held {
		var info lockInfo
		b, _ := os.ReadFile(path)
		_ = json.Unmarshal(b, &info) // an empty file: the pid is not written yet
		f.Close()
		return nil, &RunningError{Dir: dir, PID: info.PID, URL: info.URL, Other: otherStateDir(dir)}
	}
	l := &stateLock{f: f}
	if err := l.write(lockInfo{PID: os.Getpid()}); err != nil {
		l.release()
		return nil, err
	}
	return l, nil
}

// write replaces the lock file's content in place: a new file renamed
// over it would be another inode, unlocked, for the next up to take.
func (l *stateLock) write(info lockInfo) error {
	b, _ := json.Marshal(info)
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("writing %s: %w", l.f.Name(), err)
	}
	if _, err := l.f.WriteAt(append(b, '\n'), 0); err != nil {
		return fmt.Errorf("writing %s: %w", l.f.Name(), err)
	}
	return nil
}

// release empties the file (no stale pid for a reader) and unlocks it.
func (l *stateLock) release() {
	if l == nil || l.f == nil {
		return
	}
	_ = l.f.Truncate(0)
	unlock(l.f)
	_ = l.f.Close()
	l.f = nil
}

// otherStateDir is dir-2 (or -3, …): the first sibling that does not
// exist, for the second stack the refusal suggests.
func otherStateDir(dir string) string {
	for i := 2; ; i++ {
		p := dir + "-" + strconv.Itoa(i)
		if _, err := os.Lstat(p); errors.Is(err, os.ErrNotExist) || i >= 100 {
			return p
		}
	}
}
