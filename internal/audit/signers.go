package audit

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"
)

// SignerOptions are the files and values a signer is made from: what
// `gpupass audit` and `gpupass model push` take, with cosign's flag names.
type SignerOptions struct {
	// Key is the cosign private key reference (a file or env://VAR);
	// Password decrypts it (nil: PasswordEnv through getenv).
	Key      KeyRef
	Password []byte
	// RekorURL records a key signature when SignConfig.TlogUpload is set.
	RekorURL string
	// SigningConfig and TrustedRoot are the files cosign's
	// --signing-config and --trusted-root name; empty: the public-good
	// Sigstore instance's, from its TUF repository.
	SigningConfig, TrustedRoot string
}

// NewSigner makes the signer Decide chose: the key, or a keyless signer
// with the OIDC token of the decision's source. Every command that signs
// makes its signer here, so key and keyless mean the same everywhere.
func NewSigner(ctx context.Context, dec Decision, cfg SignConfig, o SignerOptions, getenv func(string) string, log *slog.Logger) (Signer, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	switch dec.Mode {
	case ModeKey:
		pw := o.Password
		if pw == nil {
			pw = []byte(getenv(PasswordEnv))
		}
		key, err := LoadPrivateKey(o.Key, pw, getenv, log)
		if err != nil {
			return nil, err
		}
		rekor := ""
		if cfg.TlogUpload {
			rekor = o.RekorURL
		}
		return NewKeySigner(key, rekor)
	case ModeKeyless:
		sc, tr, err := LoadSigstore(o.SigningConfig, o.TrustedRoot)
		if err != nil {
			return nil, err
		}
		log.Info("signing keyless", "token", dec.TokenSource, "signing_config", cmp.Or(o.SigningConfig, "public-good Sigstore"))
		tok, err := IDToken(ctx, dec, cfg, getenv, &http.Client{Timeout: 30 * time.Second})
		if err != nil {
			return nil, err
		}
		return NewKeylessSigner(tok, sc, tr)
	}
	return nil, errors.New("no signing mode decided")
}
