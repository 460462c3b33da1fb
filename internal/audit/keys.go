package audit

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"

	"github.com/secure-systems-lab/go-securesystemslib/encrypted"
	"github.com/sigstore/cosign/v2/pkg/cosign"
	"github.com/sigstore/sigstore/pkg/cryptoutils"

	"github.com/gpupass/gpupass/internal/fielderr"
	"github.com/gpupass/gpupass/internal/fsutil"
)

// PasswordEnv is the variable cosign reads the key password from; gpupass
// reads the same one so that one secret serves both tools.
const PasswordEnv = "COSIGN_PASSWORD"

// ErrWrongPassword is returned when a key does not decrypt.
var ErrWrongPassword = errors.New("wrong password for the key (COSIGN_PASSWORD)")

// KeyRef names a key: a file path, or env://VAR for the PEM in a variable
// (the cosign convention).
type KeyRef string

func (k KeyRef) envVar() (string, bool) {
	return strings.CutPrefix(string(k), "env://")
}

// read returns the key bytes, and for files their permissions.
func (k KeyRef) read(getenv func(string) string) ([]byte, os.FileMode, error) {
	if v, ok := k.envVar(); ok {
		b := getenv(v)
		if b == "" {
			return nil, 0, fmt.Errorf("key %s: variable %s is empty or unset", k, v)
		}
		return []byte(b), 0, nil
	}
	fi, err := os.Stat(string(k))
	if err != nil {
		return nil, 0, fmt.Errorf("reading key: %w", err)
	}
	b, err := os.ReadFile(string(k))
	if err != nil {
		return nil, 0, fmt.Errorf("reading key: %w", err)
	}
	return b, fi.Mode().Perm(), nil
}

// LoadPrivateKey loads a cosign private key (the encrypted PEM that
// `cosign generate-key-pair` and `gpupass audit keygen` write) and
// decrypts it with password. Plain PKCS#8 and SEC 1 EC keys are accepted
// too, as cosign does.
func LoadPrivateKey(ref KeyRef, password []byte, getenv func(string) string, log *slog.Logger) (*ecdsa.PrivateKey, error) {
	b, perm, err := ref.read(getenv)
	if err != nil {
		return nil, err
	}
	block, _ := pem.Decode(b)
	if block == nil {
		return nil, fmt.Errorf("key %s: not PEM: want a cosign private key (make one with `gpupass audit keygen`)", ref)
	}
	var key any
	switch block.Type {
	case cosign.SigstorePrivateKeyPemType, cosign.CosignPrivateKeyPemType:
		der, err := encrypted.Decrypt(block.Bytes, password)
		if err != nil {
			return nil, fmt.Errorf("key %s: %w", ref, ErrWrongPassword)
		}
		key, err = x509.ParsePKCS8PrivateKey(der)
		if err != nil {
			return nil, fmt.Errorf("key %s: parsing decrypted key: %w", ref, err)
		}
	case cosign.PrivateKeyPemType:
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case cosign.ECPrivateKeyPemType:
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "PUBLIC KEY":
		return nil, fielderr.New(FieldKey, string(ref), "is a public key: signing takes the private key (cosign.key)")
	default:
		return nil, fmt.Errorf("key %s: unsupported PEM type %q: want %q", ref, block.Type, cosign.SigstorePrivateKeyPemType)
	}
	if err != nil {
		return nil, fmt.Errorf("key %s: %w", ref, err)
	}
	// A signing key that others can read no longer proves who signed.
	if perm&0o077 != 0 && log != nil {
		log.Warn("signing key file is readable by group or others: run chmod 600 on it",
			"file", string(ref), "mode", fmt.Sprintf("%04o", perm))
	}
	ec, ok := key.(*ecdsa.PrivateKey)
	if !ok || ec.Curve != elliptic.P256() {
		return nil, fmt.Errorf("key %s: %T keys are not supported: use an ECDSA P-256 key (cosign generate-key-pair's default)", ref, key)
	}
	return ec, nil
}

// LoadPublicKey loads a PEM public key (cosign.pub, agent.pub) from a file
// or env://VAR.
func LoadPublicKey(ref KeyRef, getenv func(string) string) (crypto.PublicKey, []byte, error) {
	b, _, err := ref.read(getenv)
	if err != nil {
		return nil, nil, err
	}
	pub, err := cryptoutils.UnmarshalPEMToPublicKey(b)
	if err != nil {
		return nil, nil, fmt.Errorf("key %s: not a PEM public key: %w", ref, err)
	}
	return pub, b, nil
}

// GenerateKeyPair makes a cosign-compatible key pair: an ECDSA P-256
// private key encrypted with password (PEM "ENCRYPTED SIGSTORE PRIVATE
// KEY") and its PKIX PEM public key.
func GenerateKeyPair(password []byte) (priv, pub []byte, err error) {
	kb, err := cosign.GenerateKeyPair(func(bool) ([]byte, error) { return password, nil })
	if err != nil {
		return nil, nil, fmt.Errorf("generating key pair: %w", err)
	}
	return kb.PrivateBytes, kb.PublicBytes, nil
}

// WriteKeyPair writes prefix.key (mode 0600) and prefix.pub. It refuses
// to overwrite an existing key unless force is set: losing a signing key
// silently would orphan every report it signed.
func WriteKeyPair(prefix string, password []byte, force bool) (keyPath, pubPath string, err error) {
	keyPath, pubPath = prefix+".key", prefix+".pub"
	if !force {
		for _, p := range []string{keyPath, pubPath} {
			if _, err := os.Stat(p); err == nil {
				return "", "", fielderr.New(FieldForce, p, "already exists: replace it only on purpose (reports signed with the old key no longer verify with the new one)")
			}
		}
	}
	priv, pub, err := GenerateKeyPair(password)
	if err != nil {
		return "", "", err
	}
	if err := fsutil.WriteFileAtomic(keyPath, priv, 0o600); err != nil {
		return "", "", err
	}
	if err := fsutil.WriteFileAtomic(pubPath, pub, 0o644); err != nil {
		return "", "", err
	}
	return keyPath, pubPath, nil
}

// WriteFile writes data to path atomically with mode 0644.
func WriteFile(path string, data []byte) error { return fsutil.WriteFileAtomic(path, data, 0o644) }
