package local

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// TestStartThreadOutlivesNothing: a job's Pdeathsig follows the thread
// that forked it, and a goroutine that ends locked to its thread (private
// /tmp's mount namespaces do) retires that thread. Until the runner
// releases it after the job is reaped, the forking thread must run
// nothing else, or the job dies with it. CI saw a root job SIGKILLed two
// seconds in ("killed by signal killed", no guard event) while tests
// beside it set up private /tmp dirs.
func TestStartThreadOutlivesNothing(t *testing.T) {
	cmd := exec.Command("sleep", "2")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	release, err := (*Containment)(nil).lockedStart(cmd.SysProcAttr, cmd.Start)
	if err != nil {
		t.Fatal(err)
	}
	// The runner parks here while its readers work (its thread is free
	// for other goroutines unless it stays locked); meanwhile goroutines
	// end locked to whatever thread they ran on.
	park := time.After(1500 * time.Millisecond)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			var g sync.WaitGroup
			for range 8 {
				g.Add(1)
				go func() {
					defer g.Done()
					runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
				}()
			}
			g.Wait()
		}
	}()
	<-park
	close(stop)
	wg.Wait()
	err = cmd.Wait()
	release()
	if err != nil {
		t.Fatalf("sleep 2 ended %v; want exit 0: the thread that forked it was retired under it (Pdeathsig)", err)
	}
}
