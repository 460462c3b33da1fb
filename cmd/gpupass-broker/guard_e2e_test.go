//go:build e2e

package main_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/api/gen/gpupass/v1/gpupassv1connect"
	"github.com/gpupass/gpupass/internal/client"
	"github.com/gpupass/gpupass/internal/testutil"
)

// procKiB reads a field (VmRSS, VmHWM) of /proc/PID/status, in KiB.
func procKiB(t *testing.T, pid int, field string) int64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// TestUnauthenticatedBodiesBoundMemory is issue #16 finding 4 as the
// attacker ran it: 64 MB Submits without a token, and with a made-up one,
// 16 at once over HTTP/1.1 and h2c. Each is refused while it is still
// being sent, and the broker's peak RSS barely moves (the old broker grew
// by over a gigabyte, reading and decoding every body before it looked at
// the token).
func TestUnauthenticatedBodiesBoundMemory(t *testing.T) {
	bin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	db := brokertest.NewDB(t, "sqlite").URL()
	addr := freePort(t)
	p := serve(t, bin, db, addr)
	pid := p.cmd.Process.Pid
	before := procKiB(t, pid, "VmRSS")

	const size = 60 << 20 // under the 64 MiB Submit limit: the old broker read it all
	var wg sync.WaitGroup
	var mu sync.Mutex
	var mostSent int64
	errs := make(chan error, 16)
	for i := range 16 {
		auth := ""
		if i%2 == 1 {
			auth = "Bearer gpp_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
		}
		grpc := i%4 >= 2
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			body := brokertest.NewSubmitBody(size, grpc)
			code, msg, err := brokertest.PostRaw(ctx, "http://"+addr, gpupassv1connect.RunServiceSubmitProcedure, auth, grpc, body, body.Len())
			mu.Lock()
			mostSent = max(mostSent, body.Sent())
			mu.Unlock()
			switch {
			case err != nil:
				errs <- fmt.Errorf("call %d (grpc %v): after %d MiB: %w", i, grpc, body.Sent()>>20, err)
			case code != connect.CodeUnauthenticated:
				errs <- fmt.Errorf("call %d (grpc %v): %v %s, want unauthenticated", i, grpc, code, msg)
			case body.Sent() > 16<<20:
				errs <- fmt.Errorf("call %d (grpc %v): %d MiB of the body sent before the refusal; want it refused before the body is read", i, grpc, body.Sent()>>20)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	peak := procKiB(t, pid, "VmHWM")
	t.Logf("broker RSS before %d MiB, peak during 16 unauthenticated 60 MiB Submits %d MiB (+%d MiB); at most %d KiB of a body sent before its refusal",
		before>>10, peak>>10, (peak-before)>>10, mostSent>>10)
	if grew := (peak - before) << 10; grew > 128<<20 {
		t.Errorf("broker peak RSS grew by %d MiB; want under 128 MiB for refused calls", grew>>20)
	}
	p.stop(t)
}

// workdirArchive is a valid gzip'd tar of one incompressible file of n
// bytes, as `gpupass train --workdir` would send.
func workdirArchive(t *testing.T, n int) []byte {
	t.Helper()
	data := make([]byte, n)
	_, _ = rand.Read(data)
	var buf bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&buf, gzip.NoCompression)
	tw := tar.NewWriter(zw)
	if err := tw.WriteHeader(&tar.Header{Name: "weights.bin", Mode: 0o644, Size: int64(n), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestBodyBudget: authenticated Submits of 30 MiB work dirs, 8 at once
// from two tokens, against a broker whose body memory is capped at 100
// MiB (65 MiB per token). Each call is either stored whole or refused
// with resource_exhausted and a message that says to retry; nothing is
// stored half or lost, and the broker's RSS stays within a bound the old
// broker (which decoded all 8 at once) passed.
func TestBodyBudget(t *testing.T) {
	bin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	bdb := brokertest.NewDB(t, "sqlite")
	db := bdb.URL()
	toks := []string{tokenCreate(t, bin, db, "submit", "*"), tokenCreate(t, bin, db, "submit", "*")}
	addr := freePort(t)
	p := serve(t, bin, db, addr, "GPUPASS_MAX_BODY_MEMORY=100MiB", "GPUPASS_MAX_BODY_MEMORY_PER_TOKEN=65MiB")
	pid := p.cmd.Process.Pid
	spec, err := os.ReadFile(filepath.Join(testutil.RepoRoot(t), "broker", "testdata", "h100.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	archive := workdirArchive(t, 30<<20)
	before := procKiB(t, pid, "VmRSS")

	type result struct {
		id  string
		err error
	}
	results := make([]result, 8)
	var wg sync.WaitGroup
	for i := range results {
		c, err := client.DialRuns("http://"+addr, client.Options{Token: toks[i%2], Timeout: 2 * time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := c.Run.Submit(context.Background(), connect.NewRequest(&gpupassv1.SubmitRequest{
				SpecYaml: spec, Region: "us-west-2",
				Command: []string{"python3", "train.py"}, WorkdirArchive: archive}))
			if err == nil {
				results[i].id = resp.Msg.Run.Id
			}
			results[i].err = err
		}()
	}
	wg.Wait()
	peak := procKiB(t, pid, "VmHWM")

	s := bdb.Open(t)
	rs, ok := s.(store.Runs)
	if !ok {
		t.Fatal("the store keeps no runs")
	}
	want := sha256.Sum256(archive)
	stored, refused := 0, 0
	for i, r := range results {
		switch {
		case r.err == nil:
			stored++
			w, err := rs.Workdir(context.Background(), r.id)
			if err != nil {
				t.Errorf("submit %d: run %s accepted but its work dir is not stored: %v", i, r.id, err)
			} else if sha256.Sum256(w) != want {
				t.Errorf("submit %d: run %s stored a work dir of %d bytes that differs from the one sent", i, r.id, len(w))
			}
		case connect.CodeOf(r.err) == connect.CodeResourceExhausted && strings.Contains(r.err.Error(), "retry"):
			refused++
		default:
			t.Errorf("submit %d: %v; want it stored, or refused with resource_exhausted saying to retry", i, r.err)
		}
	}
	allocs, err := rs.ListAllocs(context.Background(), 1000, func(string) bool { return true })
	if err != nil {
		t.Fatal(err)
	}
	if len(allocs) != stored {
		t.Errorf("%d runs in the store, %d submits accepted", len(allocs), stored)
	}
	if stored == 0 {
		t.Error("no submit got through: the budget should let them through in turn")
	}
	t.Logf("8 authenticated 30 MiB Submits: %d stored, %d refused (resource_exhausted); broker RSS before %d MiB, peak %d MiB (+%d MiB)",
		stored, refused, before>>10, peak>>10, (peak-before)>>10)
	// 100 MiB of bodies, decoded once more and copied into the store:
	// about 3x; the old broker took all 8 at once (about 800 MiB).
	if grew := (peak - before) << 10; grew > 450<<20 {
		t.Errorf("broker peak RSS grew by %d MiB with --max-body-memory 100MiB; want under 450 MiB", grew>>20)
	}
	p.stop(t)
}

// TestSlowClientsDoNotStarve is issue #16 finding 5, scaled to a test
// box: a broker allowed 1,500 open files, 2,400 connections that send a
// ListNodes body one byte every 2 s (2,000 from 127.0.0.1, 400 from
// 127.0.0.3). An authenticated ListNodes from another address is answered
// while they hang on, and the broker closes every trickling connection
// itself: those over the connection caps at once, the others at the body
// deadline. (The old broker ran out of file descriptors, so the ListNodes
// was never accepted, and it kept every trickler open.)
func TestSlowClientsDoNotStarve(t *testing.T) {
	bin := testutil.BuildBinary(t, "./cmd/gpupass-broker")
	db := brokertest.NewDB(t, "sqlite").URL()
	readTok := tokenCreate(t, bin, db, "read", "*")
	addr := freePort(t)
	p := serve(t, bin, db, addr, "GPUPASS_MAX_CONNS=1000", "GPUPASS_MAX_CONNS_PER_IP=600",
		"GPUPASS_BODY_GRACE=15s", "GPUPASS_BODY_MIN_RATE=4KiB")
	pid := p.cmd.Process.Pid
	// What a default systemd unit or container gives, scaled down so a
	// test box can reach it.
	if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, &unix.Rlimit{Cur: 1500, Max: 1500}, nil); err != nil {
		t.Fatalf("lowering the broker's open-file limit: %v", err)
	}

	const step = 2 * time.Second
	const maxBytes = 20 // each trickler gives up after 40 s
	var tried, dialed, closedByBroker, heldOpen atomic.Int64
	var dialErr atomic.Value
	var wg sync.WaitGroup
	trickle := func(from string) {
		defer wg.Done()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}, Timeout: 10 * time.Second}
		c, err := d.Dial("tcp", addr)
		tried.Add(1)
		if err != nil {
			dialErr.Store(err.Error())
			closedByBroker.Add(1) // refused at the door counts as closed
			return
		}
		defer c.Close()
		fmt.Fprintf(c, "POST %s HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer %s\r\nContent-Type: application/proto\r\nContent-Length: 64\r\n\r\n",
			gpupassv1connect.NodeServiceListNodesProcedure, addr, readTok)
		dialed.Add(1)
		buf := make([]byte, 512)
		for range maxBytes {
			_ = c.SetReadDeadline(time.Now().Add(step))
			_, err := c.Read(buf)
			if !errors.Is(err, os.ErrDeadlineExceeded) {
				closedByBroker.Add(1) // an answer, EOF or a reset
				return
			}
			if _, err := c.Write([]byte{0}); err != nil {
				closedByBroker.Add(1)
				return
			}
		}
		heldOpen.Add(1)
	}
	const n1, n3 = 2000, 400
	for i := range n1 + n3 {
		from := "127.0.0.1"
		if i >= n1 {
			from = "127.0.0.3"
		}
		wg.Add(1)
		go trickle(from)
	}
	for deadline := time.Now().Add(30 * time.Second); tried.Load() < n1+n3 && time.Now().Before(deadline); {
		time.Sleep(100 * time.Millisecond)
	}
	time.Sleep(step)
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))

	// A legitimate client on another address.
	tr := &http.Transport{DialContext: (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}).DialContext}
	defer tr.CloseIdleConnections()
	node := gpupassv1connect.NewNodeServiceClient(&http.Client{Transport: tr, Timeout: 10 * time.Second}, "http://"+addr)
	req := connect.NewRequest(&gpupassv1.ListNodesRequest{})
	req.Header().Set(api.AuthHeader, "Bearer "+readTok)
	t0 := time.Now()
	_, err := node.ListNodes(context.Background(), req)
	took := time.Since(t0)
	if err != nil {
		t.Errorf("ListNodes from 127.0.0.2 with %d trickling connections: %v", dialed.Load(), err)
	}
	wg.Wait()
	p.stop(t)
	emfile := strings.Count(p.stderr.String(), "too many open files")
	t.Logf("%d trickling connections (%d dialed, last dial error %v): broker held %d fds; ListNodes from another address took %s (err %v); closed by the broker %d, still open after %d bytes %d; 'too many open files' logged %d times",
		n1+n3, dialed.Load(), dialErr.Load(), len(fds), took.Round(time.Millisecond), err, closedByBroker.Load(), maxBytes, heldOpen.Load(), emfile)
	if heldOpen.Load() > 0 {
		t.Errorf("%d trickling connections were still open after %s; want the broker to end slow bodies", heldOpen.Load(), maxBytes*step)
	}
	if emfile > 0 {
		t.Errorf("the broker ran out of file descriptors (%d times)", emfile)
	}
}
