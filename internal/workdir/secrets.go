package workdir

import (
	"bytes"
	"encoding/json"
	"path"
	"regexp"
	"strings"
)

// secretHead is how much of each file is read to recognise a secret by
// its content: key headers and tokens sit at the top of the small files
// that hold them.
const secretHead = 64 << 10

// tokenRE is a gpupass API token: broker.TokenPrefix and 160 random bits
// in lowercase base32 (broker's auth test checks a minted token matches).
var tokenRE = regexp.MustCompile(`gpp_[a-z2-7]{32}`)

// LooksLikeToken says whether b holds a gpupass API token.
func LooksLikeToken(b []byte) bool { return tokenRE.Match(b) }

// secretName says why a file's name alone marks it as a secret, or "".
// Names are what people keep keys and credentials in; a rule on
// "*token*" is not one of them: tokenizer.json and
// special_tokens_map.json sit in every Hugging Face model directory, and
// the tokens that matter are recognised by content instead.
func secretName(name string) string {
	base := path.Base(name)
	lower := strings.ToLower(base)
	switch {
	case strings.HasSuffix(lower, ".key"):
		return "a key file (*.key)"
	case strings.HasSuffix(lower, ".pem"):
		return "a key or certificate file (*.pem)"
	case strings.HasSuffix(lower, ".p12"), strings.HasSuffix(lower, ".pfx"):
		return "a key store (*.p12, *.pfx)"
	case base == ".env":
		return "an environment file (.env)"
	case strings.HasPrefix(base, ".env."):
		// Templates committed on purpose to show the variables.
		switch strings.TrimPrefix(base, ".env.") {
		case "example", "sample", "template":
			return ""
		}
		return "an environment file (.env.*)"
	case base == "id_rsa" || base == "id_dsa" || base == "id_ecdsa" || base == "id_ed25519":
		return "an SSH private key"
	case base == ".netrc" || base == ".git-credentials" || base == ".pypirc":
		return "a credentials file (" + base + ")"
	}
	return ""
}

// secretContent says why the head of a file marks it as a secret, or "".
func secretContent(name string, head []byte) string {
	if i := bytes.Index(head, []byte("-----BEGIN ")); i >= 0 && bytes.Contains(head[i:], []byte("PRIVATE KEY-----")) {
		return "it holds a private key"
	}
	if LooksLikeToken(head) {
		return "it holds a gpupass API token"
	}
	if path.Base(name) == "config.json" {
		var v map[string]any
		if json.Unmarshal(head, &v) == nil {
			for k, x := range v {
				if s, ok := x.(string); ok && s != "" && strings.Contains(strings.ToLower(k), "token") {
					return "a config.json with a token (" + k + ")"
				}
			}
		}
	}
	return ""
}
