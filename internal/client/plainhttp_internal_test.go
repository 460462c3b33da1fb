package client

import (
	"testing"

	"github.com/gpupass/gpupass/internal/api"
)

// TestLoopbackOnly: the check net.Dialer runs before each connect lets
// only loopback addresses through, whatever name they came from.
func TestLoopbackOnly(t *testing.T) {
	t.Parallel()
	check := loopbackOnly("http://user:pw@broker.example:7070")
	for addr, ok := range map[string]bool{
		"127.0.0.1:7070":        true,
		"127.9.9.9:7070":        true,
		"[::1]:7070":            true,
		"198.18.0.2:7070":       false,
		"192.168.1.10:7070":     false,
		"[::ffff:10.0.0.1]:80":  false,
		"[fe80::1%eth0]:7070":   false,
		"0.0.0.0:7070":          false,
		"[2001:db8::1]:7070":    false,
		"[::ffff:127.0.0.1]:80": true,
	} {
		err := check("tcp", addr, nil)
		if ok != (err == nil) {
			t.Errorf("%s: %v, want allowed=%v", addr, err, ok)
		}
		if p, isPlain := api.PlainHTTP(err); err != nil && (!isPlain || p.URL != "http://user:xxxxx@broker.example:7070") {
			t.Errorf("%s: %v, want a plain HTTP refusal naming the URL without its password", addr, err)
		}
	}
}
