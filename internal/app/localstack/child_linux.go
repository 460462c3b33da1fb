package localstack

import "syscall"

// childAttr gives each child of `up` its own process group (Ctrl-C in
// the terminal reaches only `up`, which stops them in order) and makes it
// die with `up`.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
