package bundle

import (
	"strings"
	"testing"
)

// TestCheckManifest: what a pull checks in a manifest before it fetches
// any blob (issue #16, finding 9).
func TestCheckManifest(t *testing.T) {
	t.Parallel()
	const wheel = `{"mediaType":"application/vnd.gpupass.wheel.v1+zip","digest":"sha256:` + "1111111111111111111111111111111111111111111111111111111111111111" + `","size":10,"annotations":{"org.opencontainers.image.title":"a-1.0-py3-none-any.whl"}}`
	manifest := func(mt, config, layer string) string {
		return `{"schemaVersion":2,"mediaType":"` + mt + `","artifactType":"` + ArtifactType + `","config":` + config + `,"layers":[` + layer + `]}`
	}
	empty := `{"mediaType":"application/vnd.oci.empty.v1+json","digest":"` + emptyDigest + `","size":2}`
	const oci = "application/vnd.oci.image.manifest.v1+json"
	for _, tc := range []struct {
		name, raw, contentType, want string
	}{
		{"a bundle", manifest(oci, empty, wheel), oci, ""},
		{"served as another type", manifest(oci, empty, wheel), "application/vnd.docker.distribution.manifest.v2+json", "serves it as"},
		{"an index", `{"schemaVersion":2,"mediaType":"application/vnd.oci.image.index.v1+json","manifests":[]}`, "", "is an index"},
		{"schema 1", `{"schemaVersion":1,"mediaType":"` + oci + `","config":` + empty + `}`, oci, "schemaVersion 1"},
		{"config media type changed", manifest(oci, strings.Replace(empty, "empty", "emptz", 1), wheel), oci, "OCI empty descriptor"},
		{"config size changed", manifest(oci, strings.Replace(empty, `"size":2`, `"size":3`, 1), wheel), oci, "OCI empty descriptor"},
		{"config media type not a media type", manifest(oci, strings.Replace(empty, "application/vnd.oci.empty.v1+json", "not a type", 1), wheel), oci, "is not a media type"},
		{"layer media type not a media type", manifest(oci, empty, strings.Replace(wheel, "application/vnd.gpupass.wheel.v1+zip", "application/", 1)), oci, "layer 0: media type"},
		{"negative layer size", manifest(oci, empty, strings.Replace(wheel, `"size":10`, `"size":-1`, 1)), oci, "negative size"},
	} {
		_, err := checkManifest([]byte(tc.raw), tc.contentType)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: err = %v, want one saying %q", tc.name, err, tc.want)
		}
	}
}
