package broker

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/gpupass/gpupass/broker/store"
)

// Page tokens of ListNodes and ListRuns. A token names the last row of
// the page it came with (a keyset position, never an offset) and is
// bound to the caller's token and the request's filters. Brokers share
// no secret to sign it with (replicas and restarts must accept each
// other's tokens), so it is validated instead: a checksum catches a
// token altered by accident, the binding refuses one replayed with other
// filters or by another token, and the position must name a row the
// caller may see (a node or run in its scope and filters; a run's time
// must be the stored one). The scope itself is never read from the page
// token: every page is filtered by the caller's token, so no page token
// can reach outside it.

// maxPageSize caps ListNodes' page_size, as ListRuns' limit is capped.
const maxPageSize = 1000

type pageToken struct {
	Kind string `json:"k"`           // "nodes" or "runs"
	Bind string `json:"b"`           // pageBinding of the request that made it
	ID   string `json:"i"`           // the page's last node or run id
	At   int64  `json:"t,omitempty"` // runs: the last run's created_at (unix ns)
}

// errStalePosition is why a page token whose position names no row the
// caller may see now is refused.
const errStalePosition = "names a position that is not one of your rows (it was altered, or the row is gone)"

// errPageToken is the refusal of every malformed or misplaced page
// token: it says what to do, not which check failed.
func errPageToken(why string) error {
	return connect.NewError(connect.CodeInvalidArgument,
		fmt.Errorf("page_token %s; send the request again without page_token to start from the first page", why))
}

// pageBinding ties a page token to the caller's token and the request's
// filters (everything but the position), so a token cannot be replayed
// with another filter or by another caller.
func pageBinding(kind string, tok store.Token, filters ...string) string {
	h := sha256.New()
	for _, s := range append([]string{kind, tok.ID, strings.Join(tok.Regions, "\x1f")}, filters...) {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil)[:12])
}

// regionFilter is a request's region filter as pageBinding reads it:
// order and duplicates do not change what it selects.
func regionFilter(regions []string) string {
	rs := make([]string, 0, len(regions))
	for _, r := range regions {
		rs = append(rs, strings.TrimSpace(r))
	}
	slices.Sort(rs)
	return strings.Join(slices.Compact(rs), "\x1f")
}

func encodePageToken(t pageToken) string {
	b, _ := json.Marshal(t) // strings and an int: cannot fail
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(append(b, sum[:8]...))
}

// decodePageToken reads s and checks its checksum, kind and binding;
// the caller validates the position.
func decodePageToken(s, kind, bind string) (pageToken, error) {
	var t pageToken
	if len(s) > 512 {
		return t, errPageToken("is too long to be one the broker issued")
	}
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) < 9 {
		return t, errPageToken("is not one the broker issued (not its encoding)")
	}
	body, sum := b[:len(b)-8], b[len(b)-8:]
	if want := sha256.Sum256(body); string(want[:8]) != string(sum) {
		return t, errPageToken("was altered (its checksum does not match)")
	}
	if err := json.Unmarshal(body, &t); err != nil || t.ID == "" {
		return t, errPageToken("is not one the broker issued")
	}
	if t.Kind != kind {
		return t, errPageToken(fmt.Sprintf("is a %s token, not a %s one", t.Kind, kind))
	}
	if t.Bind != bind {
		return t, errPageToken("was issued for other filters or to another token")
	}
	return t, nil
}
