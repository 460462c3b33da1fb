package client_test

import (
	"context"
	"strings"
	"testing"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/brokertest"
	"github.com/gpupass/gpupass/broker/store"
	"github.com/gpupass/gpupass/internal/api"
	gpupassv1 "github.com/gpupass/gpupass/internal/api/gen/gpupass/v1"
	"github.com/gpupass/gpupass/internal/client"
)

// TestPlainHTTPRule: a token goes over http:// only to loopback; an
// address literal anywhere else (private ranges too) is refused at Dial,
// before anything is sent, unless InsecureHTTP; https:// and calls
// without a token are not the rule's business. The network half (no
// connection is made, names) is TestTokenNotOverPlainHTTP's, with the
// built binaries and a network namespace.
func TestPlainHTTPRule(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		url    string
		o      client.Options
		refuse string // the host named in the refusal; empty: Dial succeeds
	}{
		{name: "benchmark range", url: "http://198.18.0.2:7070", o: client.Options{Token: "t"}, refuse: "198.18.0.2"},
		{name: "private range", url: "http://10.1.2.3:7070", o: client.Options{Token: "t"}, refuse: "10.1.2.3"},
		{name: "IPv6", url: "http://[2001:db8::1]:7070", o: client.Options{Token: "t"}, refuse: "2001:db8::1"},
		{name: "wildcard", url: "http://0.0.0.0:7070", o: client.Options{Token: "t"}, refuse: "0.0.0.0"},
		{name: "one replica of two", url: "http://127.0.0.1:7070,http://198.18.0.2:7070", o: client.Options{Token: "t"}, refuse: "198.18.0.2"},
		{name: "agent proof without token", url: "http://198.18.0.2:7070", o: client.Options{Agent: &api.AgentCredentials{}}, refuse: "198.18.0.2"},
		{name: "loopback", url: "http://127.0.0.2:7070", o: client.Options{Token: "t"}},
		{name: "IPv6 loopback", url: "http://[::1]:7070", o: client.Options{Token: "t"}},
		{name: "localhost", url: "http://localhost:7070", o: client.Options{Token: "t"}},
		{name: "a name is checked when dialed", url: "http://broker.example:7070", o: client.Options{Token: "t"}},
		{name: "consent", url: "http://198.18.0.2:7070", o: client.Options{Token: "t", InsecureHTTP: true}},
		{name: "https", url: "https://198.18.0.2:7070", o: client.Options{Token: "t"}},
		{name: "no token", url: "http://198.18.0.2:7070"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := client.Dial(tt.url, tt.o)
			_, errRuns := client.DialRuns(tt.url, tt.o)
			for _, err := range []error{err, errRuns} {
				if tt.refuse == "" {
					if err != nil {
						t.Errorf("Dial(%s): %v, want no refusal", tt.url, err)
					}
					continue
				}
				p, ok := api.PlainHTTP(err)
				if !ok {
					t.Fatalf("Dial(%s): %v, want a plain HTTP refusal", tt.url, err)
				}
				if p.Host != tt.refuse {
					t.Errorf("refusal names host %q, want %q", p.Host, tt.refuse)
				}
				for _, w := range []string{"refusing to send the broker token over plain HTTP", tt.refuse + " is not a loopback address", "https://", api.FieldInsecureHTTP} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("refusal %q lacks %q", err, w)
					}
				}
			}
		})
	}
}

// TestLoopbackByName: over plain HTTP a name is fine when what it
// resolves to is loopback: "localhost" reaches a real broker with the
// token.
func TestLoopbackByName(t *testing.T) {
	t.Parallel()
	b := brokertest.Start(t, brokertest.NewDB(t, "sqlite"), brokertest.Fast())
	url := strings.Replace(b.URL, "127.0.0.1", "localhost", 1)
	if url == b.URL {
		t.Fatalf("broker URL %s is not on 127.0.0.1", b.URL)
	}
	c, err := client.Dial(url, client.Options{Token: b.Token(t, store.RoleRead, "*")})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Node.ListNodes(context.Background(), connect.NewRequest(&gpupassv1.ListNodesRequest{})); err != nil {
		t.Errorf("ListNodes at %s: %v", url, err)
	}
}
