package brokertest

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"

	"connectrpc.com/connect"
)

// SubmitBody is the body of a Submit carrying size bytes of work dir
// archive (field 6), made up as it is sent so that the test holds none of
// it; Sent counts what the client has handed to the connection. Tests of
// request limits send it with PostRaw.
type SubmitBody struct {
	prefix []byte
	left   int64
	read   atomic.Int64
}

// NewSubmitBody makes a Submit body of size bytes; grpc frames it for gRPC.
func NewSubmitBody(size int64, grpc bool) *SubmitBody {
	field := binary.AppendUvarint([]byte{6<<3 | 2}, uint64(size))
	prefix := field
	if grpc {
		prefix = binary.BigEndian.AppendUint32([]byte{0}, uint32(int64(len(field))+size))
		prefix = append(prefix, field...)
	}
	return &SubmitBody{prefix: prefix, left: size}
}

// Sent is how many bytes the client has taken from the body so far.
func (b *SubmitBody) Sent() int64 { return b.read.Load() }

// Len is the body's length, as sent in Content-Length.
func (b *SubmitBody) Len() int64 { return int64(len(b.prefix)) + b.left }

func (b *SubmitBody) Read(p []byte) (int, error) {
	n := copy(p, b.prefix)
	b.prefix = b.prefix[n:]
	if rest := min(int64(len(p)-n), b.left); rest > 0 {
		clear(p[n : n+int(rest)])
		n += int(rest)
		b.left -= rest
	}
	b.read.Add(int64(n))
	if n == 0 {
		return 0, io.EOF
	}
	return n, nil
}

// PostRaw posts body to a procedure in the Connect protocol over HTTP/1.1
// or in gRPC over h2c, without a connect client (which would hold the
// whole message), and returns the code and message the broker answered.
// A size of -1 sends a body of unknown length.
func PostRaw(ctx context.Context, baseURL, proc, auth string, grpc bool, body io.Reader, size int64) (connect.Code, string, error) {
	tr := &http.Transport{Protocols: new(http.Protocols)}
	if grpc {
		tr.Protocols.SetUnencryptedHTTP2(true)
	} else {
		tr.Protocols.SetHTTP1(true)
	}
	defer tr.CloseIdleConnections()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+proc, body)
	if err != nil {
		return 0, "", err
	}
	req.ContentLength = size
	req.Header.Set("Content-Type", "application/proto")
	if grpc {
		req.Header.Set("Content-Type", "application/grpc+proto")
		req.Header.Set("Te", "trailers")
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	msg, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if grpc {
		st := resp.Header.Get("Grpc-Status")
		if st == "" {
			st = resp.Trailer.Get("Grpc-Status")
		}
		n, err := strconv.Atoi(st)
		if err != nil {
			return 0, "", fmt.Errorf("no grpc-status in the answer (HTTP %d): %s", resp.StatusCode, msg)
		}
		return connect.Code(n), resp.Header.Get("Grpc-Message") + resp.Trailer.Get("Grpc-Message"), nil
	}
	var e struct{ Code, Message string }
	if err := json.Unmarshal(msg, &e); err != nil {
		return 0, "", fmt.Errorf("HTTP %d, not a Connect error: %s", resp.StatusCode, msg)
	}
	var c connect.Code
	if err := c.UnmarshalText([]byte(e.Code)); err != nil {
		return 0, "", err
	}
	return c, e.Message, nil
}
