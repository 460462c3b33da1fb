package executor

import (
	"fmt"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// RunAs is the user a job's command runs as when it is not the agent's
// own. A job running as the agent's user can read the agent's identity
// key and sign conformance reports the node never measured; as another
// user it cannot (the key is 0600, the agent's environment and memory
// are out of its reach).
type RunAs struct {
	// Spec is what the operator wrote (--run-as), for messages.
	Spec   string
	UID    uint32
	GID    uint32
	Groups []uint32
	// Name and Home come from the user database; empty for a numeric
	// uid it does not list.
	Name string
	Home string
	// Private says the uid is this run's alone (--run-as-range): every
	// process that holds it is the run's, and all of them are killed
	// when the run ends. A shared --run-as user may have processes that
	// are not jobs' (nobody), so it is never killed by uid.
	Private bool
	// Shared says the private uid is held by several runs of this agent
	// at once, the ranks of one gang that one cluster job runs as it
	// (local.UIDRange.AcquireShared): a run's end must not kill the
	// uid's processes, which may be another rank's; its last holder's
	// release does (local.UIDRange.Release).
	Shared bool
}

// Fields of the errors LookupRunAs and ParseUIDRange return
// (*fielderr.Error): the agent's command layer names its flags for them.
const (
	FieldRunAs    = "job user"
	FieldUIDRange = "job uid range"
)

// LookupRunAs resolves USER, UID, USER:GROUP or UID:GID. A user the
// database knows brings its primary group and supplementary groups; a
// group given after the colon replaces the primary one.
func LookupRunAs(s string) (*RunAs, error) {
	userPart, groupPart, hasGroup := strings.Cut(s, ":")
	if userPart == "" || (hasGroup && groupPart == "") {
		return nil, fielderr.New(FieldRunAs, s, "want USER, UID, USER:GROUP or UID:GID")
	}
	r := &RunAs{Spec: s}
	u, err := lookupUser(userPart)
	switch {
	case err == nil:
		uid, _ := strconv.ParseUint(u.Uid, 10, 32)
		gid, _ := strconv.ParseUint(u.Gid, 10, 32)
		r.UID, r.GID, r.Name, r.Home = uint32(uid), uint32(gid), u.Username, u.HomeDir
		if ids, err := u.GroupIds(); err == nil {
			for _, g := range ids {
				if n, err := strconv.ParseUint(g, 10, 32); err == nil {
					r.Groups = append(r.Groups, uint32(n))
				}
			}
		}
	case NumericID(userPart):
		// A uid the user database does not list (a container image
		// without it): its group must be given.
		n, perr := strconv.ParseUint(userPart, 10, 32)
		if perr != nil {
			return nil, fielderr.New(FieldRunAs, s, "uid %s is out of range", userPart)
		}
		if !hasGroup {
			return nil, fielderr.New(FieldRunAs, s, "uid %s is not in the user database, so its group is unknown: give it as UID:GID", userPart)
		}
		r.UID = uint32(n)
	default:
		return nil, fielderr.New(FieldRunAs, s, "no such user (%v); create it (useradd --system --no-create-home gpupass-job) or give a numeric UID:GID", err)
	}
	if hasGroup {
		gid, err := LookupGroup(groupPart)
		if err != nil {
			return nil, fielderr.New(FieldRunAs, s, "%w", err)
		}
		r.GID = gid
		// The primary group of the user database no longer applies;
		// its supplementary groups still do.
	}
	if r.UID == 0 {
		return nil, fielderr.New(FieldRunAs, s, "is root: jobs would read the agent's identity key; name an unprivileged user")
	}
	return r, nil
}

func lookupUser(s string) (*user.User, error) {
	if NumericID(s) {
		return user.LookupId(s)
	}
	return user.Lookup(s)
}

// LookupGroup resolves a group name or gid to its gid.
func LookupGroup(s string) (uint32, error) {
	if NumericID(s) {
		n, err := strconv.ParseUint(s, 10, 32)
		if err != nil {
			return 0, fmt.Errorf("gid %s is out of range", s)
		}
		return uint32(n), nil
	}
	g, err := user.LookupGroup(s)
	if err != nil {
		return 0, fmt.Errorf("no such group: %v", err)
	}
	n, _ := strconv.ParseUint(g.Gid, 10, 32)
	return uint32(n), nil
}

// NumericID says s is a uid or gid given as digits rather than a name.
func NumericID(s string) bool {
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// String names the identity in logs and events: "nobody (uid 65534, gid 65534)".
func (r *RunAs) String() string {
	name := r.Name
	if name == "" {
		name = "uid " + strconv.FormatUint(uint64(r.UID), 10)
		return fmt.Sprintf("%s (gid %d)", name, r.GID)
	}
	return fmt.Sprintf("%s (uid %d, gid %d)", name, r.UID, r.GID)
}

// credential is what the command's process is started with.
func (r *RunAs) credential() *syscall.Credential {
	if r == nil {
		return nil
	}
	return &syscall.Credential{Uid: r.UID, Gid: r.GID, Groups: append([]uint32(nil), r.Groups...)}
}

// env is what the job's environment says about its user: HOME (the
// user's home when it exists, else the work dir: HOME=/root or a
// missing /nonexistent sends tools' caches into errors), USER and
// LOGNAME.
func (r *RunAs) env(workDir string) map[string]string {
	home := workDir
	if r.Home != "" {
		if fi, err := os.Stat(r.Home); err == nil && fi.IsDir() {
			home = r.Home
		}
	}
	m := map[string]string{"HOME": home}
	if r.Name != "" {
		m["USER"], m["LOGNAME"] = r.Name, r.Name
	}
	return m
}

// CanReach returns an error unless the user may pass through every
// directory from / down to dir (search permission: the x bit that
// applies to it as owner, group member or other), which the jobs need to
// reach their work dirs below dir. The error names the first directory
// that stops it and the fix.
func (r *RunAs) CanReach(dir string) error {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return err
	}
	for p := abs; ; p = filepath.Dir(p) {
		fi, err := os.Stat(p)
		if err != nil {
			return err
		}
		if st, ok := fi.Sys().(*syscall.Stat_t); ok && !r.mayPass(st) {
			return fmt.Errorf("%s (mode %04o, owner uid %d) does not let %s pass, so jobs cannot reach their work dirs under %s: put the state dir elsewhere (the default /var/lib/gpupass-agent), or chmod o+x %s", p, fi.Mode().Perm(), st.Uid, r, abs, p)
		}
		if p == filepath.Dir(p) {
			return nil
		}
	}
}

func (r *RunAs) mayPass(st *syscall.Stat_t) bool {
	switch {
	case st.Uid == r.UID:
		return st.Mode&0o100 != 0
	case st.Gid == r.GID || slices.Contains(r.Groups, st.Gid):
		return st.Mode&0o010 != 0
	}
	return st.Mode&0o001 != 0
}

// Owns says whether fi, the Fstat of a file the agent opened in the work
// dir, is the job's to hand to the agent. The agent reads what the job
// leaves there (metrics, checkpoints) as root: a symbolic or hard link
// to the agent's own files would otherwise carry them into the run's
// events or the broker. With no RunAs the job could read those files
// itself, and anything goes.
func (r *RunAs) Owns(fi os.FileInfo) bool {
	if r == nil {
		return true
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && st.Uid == r.UID
}

// OpenJobFile opens a regular file the job wrote, for reading: without
// following a final symbolic link, without blocking on a FIFO, and only
// when r.Owns it. The error says which rule it broke.
func (r *RunAs) OpenJobFile(path string) (*os.File, os.FileInfo, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, nil, err
	}
	fi, err := f.Stat()
	switch {
	case err != nil:
	case !fi.Mode().IsRegular():
		err = fmt.Errorf("%s is not a regular file (%s): not read", path, fi.Mode().Type())
	case !r.Owns(fi):
		err = fmt.Errorf("%s does not belong to the job's user %s: not read", path, r)
	}
	if err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// takeBack closes the work dir of a run that ended to the job's user:
// the dir itself goes back to the agent (0700), so later jobs, which run
// as the same user, cannot enter it; what is inside stays as the job
// left it, for the agent to read.
func (r *RunAs) takeBack(workDir string) error {
	err := os.Lchown(workDir, os.Geteuid(), os.Getegid())
	if err == nil {
		err = os.Chmod(workDir, 0o700)
	}
	if err != nil {
		return fmt.Errorf("closing the work dir to %s after the run: %w", r, err)
	}
	return nil
}

// handOver gives the run's work dir to the job's user: everything the
// agent put there (the run's files, a checkpoint to resume from, the
// checkpoint dir and the metrics file) becomes the user's, and the dir
// is closed to others (0700). Symbolic links are changed themselves,
// never followed; a file with other hard links is refused, as it is
// someone else's file as well.
func (r *RunAs) handOver(workDir string) error {
	err := filepath.WalkDir(workDir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			fi, err := d.Info()
			if err != nil {
				return err
			}
			if st, ok := fi.Sys().(*syscall.Stat_t); ok && st.Nlink > 1 {
				return fmt.Errorf("%s has %d hard links: not handing it to the job's user", p, st.Nlink)
			}
		}
		return os.Lchown(p, int(r.UID), int(r.GID))
	})
	if err == nil {
		err = os.Chmod(workDir, 0o700)
	}
	if err != nil {
		return fmt.Errorf("handing the work dir to %s: %w", r, err)
	}
	return nil
}
