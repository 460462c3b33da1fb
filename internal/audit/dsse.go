package audit

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"

	sgverify "github.com/sigstore/sigstore-go/pkg/verify"
)

// VerifyAttestation checks a sigstore bundle holding a DSSE envelope, as
// `cosign verify-attestation` checks one attached to an image: signed with
// opts.Key, or keyless by opts.Identity (its certificate, log entry and
// signed timestamp checked against the identity's trusted root), and the
// in-toto statement names an artifact of digest sha256Hex among its
// subjects. It returns the envelope's payload (the statement) for the
// caller to read, the payload type being InTotoPayloadType, and for a
// keyless bundle who signed it.
func VerifyAttestation(ctx context.Context, bundleJSON []byte, opts VerifyOptions, sha256Hex string) ([]byte, *SignedBy, error) {
	if opts.Key == nil && opts.Identity == nil {
		return nil, nil, errors.New("no public key or keyless identity given")
	}
	d, err := hex.DecodeString(sha256Hex)
	if err != nil || len(d) != 32 {
		return nil, nil, fmt.Errorf("subject digest %q is not a sha256 hex digest", sha256Hex)
	}
	bd, signer, err := verifyBundle(ctx, bundleJSON, VerifyOptions{Key: opts.Key, Identity: opts.Identity}, sgverify.WithArtifactDigest("sha256", d))
	if err != nil {
		return nil, nil, err
	}
	env := bd.GetDsseEnvelope()
	if env == nil {
		return nil, nil, errors.New("the bundle is a plain message signature, not a DSSE envelope around an in-toto statement")
	}
	if env.GetPayloadType() != InTotoPayloadType {
		return nil, nil, fmt.Errorf("the DSSE payload type is %q, want %q", env.GetPayloadType(), InTotoPayloadType)
	}
	return env.GetPayload(), signer, nil
}
