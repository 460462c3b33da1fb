package spec

import (
	"fmt"
	"strings"
)

// PinMatches reports whether an installed version satisfies the exact pin
// "==pin" under PEP 440's version matching rules: the one rule the agent,
// `validate --local`, bundle coverage and the wheel installer share.
//
//   - Release segments are compared with zero padding: ==1.26 matches 1.26.0.
//   - Epochs, pre-, post- and dev-releases must be equal: ==1.0 does not
//     match 1.0rc1, 1.0.post1 or 1!1.0.
//   - A pin without a local label ignores the installed local label
//     (==2.4.0 matches 2.4.0+cu121, as PEP 440 says for ==); a pin with one
//     requires the same label after normalisation (==2.4.0+cu121 does not
//     match 2.4.0+cu118 nor 2.4.0).
//
// Wildcards (==2.4.*) are not exact pins and give an error, as does a
// version that is not PEP 440: the caller decides what an unreadable
// version means, so none is matched by accident as a string.
func PinMatches(pin, installed string) (bool, error) {
	if strings.HasSuffix(strings.TrimSpace(pin), ".*") {
		return false, fmt.Errorf("pin ==%s is a wildcard, not an exact version", pin)
	}
	p, err := ParseVersion(pin)
	if err != nil {
		return false, fmt.Errorf("pinned version: %w", err)
	}
	h, err := ParseVersion(installed)
	if err != nil {
		return false, fmt.Errorf("installed version: %w", err)
	}
	if p.Compare(h) != 0 {
		return false, nil
	}
	return p.Local == "" || p.Local == h.Local, nil
}
