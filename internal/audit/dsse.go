package audit

import (
	"context"
	"crypto"
	"encoding/hex"
	"errors"
	"fmt"

	sgverify "github.com/sigstore/sigstore-go/pkg/verify"
)

// VerifyAttestation checks a key-based sigstore bundle holding a DSSE
// envelope, as `cosign verify-attestation --key K` checks one attached to
// an image: the signature verifies with key and the in-toto statement
// names an artifact of digest sha256Hex among its subjects. It returns the
// envelope's payload (the statement) for the caller to read; the payload
// type is InTotoPayloadType.
func VerifyAttestation(ctx context.Context, bundleJSON []byte, key crypto.PublicKey, sha256Hex string) ([]byte, error) {
	if key == nil {
		return nil, errors.New("no public key given")
	}
	d, err := hex.DecodeString(sha256Hex)
	if err != nil || len(d) != 32 {
		return nil, fmt.Errorf("subject digest %q is not a sha256 hex digest", sha256Hex)
	}
	bd, _, err := verifyBundle(ctx, bundleJSON, VerifyOptions{Key: key}, sgverify.WithArtifactDigest("sha256", d))
	if err != nil {
		return nil, err
	}
	env := bd.GetDsseEnvelope()
	if env == nil {
		return nil, errors.New("the bundle is a plain message signature, not a DSSE envelope around an in-toto statement")
	}
	if env.GetPayloadType() != InTotoPayloadType {
		return nil, fmt.Errorf("the DSSE payload type is %q, want %q", env.GetPayloadType(), InTotoPayloadType)
	}
	return env.GetPayload(), nil
}
