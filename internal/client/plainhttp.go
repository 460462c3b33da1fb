package client

import (
	"net"
	"net/url"
	"strings"
	"syscall"

	"github.com/gpupass/gpupass/internal/api"
)

// The plain HTTP rule: a bearer token (or an agent's proof) goes over
// http:// only to a loopback address (127.0.0.0/8, ::1), where no network
// carries it. Anything else needs https://, or the caller's explicit
// Options.InsecureHTTP. Private ranges (10/8, 192.168/16, a cluster's
// pod network) count as network: a token read there is as good as one
// read anywhere.
//
// The check is made twice, both times before any byte leaves:
//   - at Dial, on the URL: an address literal that is not loopback is
//     refused at once, so a command or an agent stops before it starts;
//   - at each connection, on the address actually dialed (net.Dialer's
//     Control runs before connect(2)): a name ("localhost", a host name)
//     is allowed only as far as each address it resolves to is loopback,
//     checked when it is used, so a name that later resolves elsewhere
//     (DNS rebinding, an edited /etc/hosts) is refused too. No proxy is
//     used then: it would carry the token on to wherever it goes.

// LoopbackHost reports whether host (a URL's or listener's host, without
// port) stands for this machine alone: "localhost" or a loopback address.
// Other names are not looked up here; Dial checks what they resolve to.
func LoopbackHost(host string) bool {
	if strings.EqualFold(strings.TrimSuffix(host, "."), "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// PlainHTTPOffHost returns the first URL of a broker URL list that is
// http:// to a host LoopbackHost does not vouch for: where a token may
// cross a network unencrypted, the URL Options.InsecureHTTP is about.
// Commands warn with it when --insecure-http is given. Empty when there is
// none (https://, loopback, or a list that does not parse).
func PlainHTTPOffHost(list string) string {
	urls, err := ParseURLs(list)
	if err != nil {
		return ""
	}
	for _, u := range urls {
		if u.Scheme == "http" && !LoopbackHost(u.Hostname()) {
			return u.Redacted()
		}
	}
	return ""
}

// refuseLiteral is the check at Dial: an http:// URL whose host is an
// address literal that is not loopback.
func refuseLiteral(urls []*url.URL) error {
	for _, u := range urls {
		if ip := net.ParseIP(u.Hostname()); ip != nil && !ip.IsLoopback() {
			return &api.PlainHTTPError{URL: u.Redacted(), Host: u.Hostname()}
		}
	}
	return nil
}

// loopbackOnly is the check at each connection: net.Dialer calls it with
// the resolved address before it connects.
func loopbackOnly(list string) func(network, address string, _ syscall.RawConn) error {
	shown := redactedList(list)
	return func(_, address string, _ syscall.RawConn) error {
		host, _, err := net.SplitHostPort(address)
		if err != nil {
			host = address
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return &api.PlainHTTPError{URL: shown, Host: host}
		}
		return nil
	}
}

// redactedList is a URL list without credentials, for errors.
func redactedList(list string) string {
	urls, err := ParseURLs(list)
	if err != nil {
		return ""
	}
	s := make([]string, len(urls))
	for i, u := range urls {
		s[i] = u.Redacted()
	}
	return strings.Join(s, ",")
}
