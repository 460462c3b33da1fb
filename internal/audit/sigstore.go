package audit

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/sigstore/sigstore-go/pkg/root"

	"github.com/gpupass/gpupass/internal/fielderr"
)

// LoadSigstore reads where to sign keyless and what to trust: the files
// `cosign signing-config create` and `cosign trusted-root create` write.
// An empty signingConfig is the public-good Sigstore instance's, fetched
// from its TUF repository as cosign does; an empty trustedRoot returns
// nil (bundles are not checked after signing).
func LoadSigstore(signingConfig, trustedRoot string) (*root.SigningConfig, root.TrustedMaterial, error) {
	var sc *root.SigningConfig
	var err error
	if signingConfig == "" {
		if sc, err = root.FetchSigningConfig(); err != nil {
			return nil, nil, tufErr(FieldSigningConfig, err)
		}
	} else if sc, err = root.NewSigningConfigFromPath(signingConfig); err != nil {
		return nil, nil, fileErr(FieldSigningConfig, signingConfig, "cosign signing-config create", err)
	}
	if trustedRoot == "" {
		return sc, nil, nil
	}
	tr, err := LoadTrustedRoot(trustedRoot)
	if err != nil {
		return nil, nil, err
	}
	return sc, tr, nil
}

// LoadTrustedRoot reads a trusted root file; "" is the public-good
// Sigstore instance's, fetched from its TUF repository.
func LoadTrustedRoot(path string) (root.TrustedMaterial, error) {
	if path == "" {
		tr, err := root.FetchTrustedRoot()
		if err != nil {
			return nil, tufErr(FieldTrustedRoot, err)
		}
		return tr, nil
	}
	tr, err := root.NewTrustedRootFromPath(path)
	if err != nil {
		return nil, fileErr(FieldTrustedRoot, path, "cosign trusted-root create", err)
	}
	return tr, nil
}

// tufErr: the public-good file could not be fetched.
func tufErr(field string, err error) error {
	return &fielderr.Error{Field: field, Err: err,
		Problem: "fetching the public-good Sigstore instance's from its TUF repository (none was given) failed: offline or on a private Sigstore, pass the file {" + field + "}"}
}

func fileErr(field, path, writer string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return &fielderr.Error{Field: field, Value: path, Problem: fmt.Sprintf("does not exist: write it with `%s`, or leave it out for the public-good Sigstore instance's", writer)}
	}
	return &fielderr.Error{Field: field, Value: path, Err: err, Problem: fmt.Sprintf("cannot be read as the file `%s` writes", writer)}
}
