//go:build !linux

package localstack

import "syscall"

// childAttr: only Linux has a parent-death signal; elsewhere (the CLI
// built for macOS) the children get their own process group and `up`
// stops them on the way out.
func childAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }
