package k8stest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/v1/random"
)

// ctr 1.6's `images ls`, SIZE in two words, LABELS last; the CRI names
// each image by its id too (sha256:…).
const imagesLs = `REF                                  TYPE                                           DIGEST      SIZE    PLATFORMS LABELS
gpupass.local/run:1                  application/vnd.oci.image.manifest.v1+json     sha256:bbbb 1.3 GiB linux/amd64     io.cri-containerd.image=managed
gpupass.local/run@sha256:aaaa        application/vnd.oci.image.manifest.v1+json     sha256:aaaa 1.3 GiB linux/amd64     io.cri-containerd.image=managed
gpupass.local/run@sha256:bbbb        application/vnd.oci.image.manifest.v1+json     sha256:bbbb 1.3 GiB linux/amd64     io.cri-containerd.image=managed,gpupass.test/imported=1796217280
sha256:1111                          application/vnd.oci.image.manifest.v1+json     sha256:aaaa 1.3 GiB linux/amd64     io.cri-containerd.image=managed
`

func TestParseImages(t *testing.T) {
	t.Parallel()
	want := []ctrImage{
		{ref: "gpupass.local/run:1", digest: "sha256:bbbb"},
		{ref: "gpupass.local/run@sha256:aaaa", digest: "sha256:aaaa"},
		{ref: "gpupass.local/run@sha256:bbbb", digest: "sha256:bbbb", imported: time.Unix(1796217280, 0)},
		{ref: "sha256:1111", digest: "sha256:aaaa"},
	}
	if diff := cmp.Diff(want, parseImages(imagesLs), cmp.AllowUnexported(ctrImage{})); diff != "" {
		t.Errorf("parseImages (-want +got):\n%s", diff)
	}
	cs := "CONTAINER    IMAGE    RUNTIME\nabc    gpupass.local/run:1    io.containerd.runc.v2\nsandbox    registry.k8s.io/pause:3.9    io.containerd.runc.v2\n"
	if diff := cmp.Diff([]string{"gpupass.local/run:1", "registry.k8s.io/pause:3.9"}, parseContainerImages(cs)); diff != "" {
		t.Errorf("parseContainerImages (-want +got):\n%s", diff)
	}
}

// TestStale: an image goes, with the CRI's name for it, unless it is the
// one just imported, a container uses it, or it was imported within the
// grace period; one imported before the label is old. Other
// repositories' images stay.
func TestStale(t *testing.T) {
	t.Parallel()
	now := time.Unix(1_800_000_000, 0)
	imgs := []ctrImage{
		{ref: "r:1", digest: "d-new"},
		{ref: "r@sha256:new", digest: "d-new", imported: now},
		{ref: "sha256:id-new", digest: "d-new"},
		{ref: "r@sha256:unlabelled", digest: "d-unlabelled"},
		{ref: "sha256:id-unlabelled", digest: "d-unlabelled"},
		{ref: "r@sha256:old", digest: "d-old", imported: now.Add(-2 * time.Hour)},
		{ref: "r@sha256:recent", digest: "d-recent", imported: now.Add(-10 * time.Minute)},
		{ref: "r@sha256:inuse", digest: "d-inuse", imported: now.Add(-2 * time.Hour)},
		{ref: "r:inuse", digest: "d-inuse"},
		{ref: "other@sha256:old", digest: "d-other"},
	}
	for _, tc := range []struct {
		name  string
		grace time.Duration
		want  []string
	}{
		{"within ImageKeep", ImageKeep, []string{"r@sha256:unlabelled", "sha256:id-unlabelled", "r@sha256:old"}},
		{"no grace", 0, []string{"r@sha256:unlabelled", "sha256:id-unlabelled", "r@sha256:old", "r@sha256:recent"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := stale(imgs, "r@sha256:new", []string{"r:inuse", "pause:3.9"}, now, tc.grace)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("stale (-want +got):\n%s", diff)
			}
		})
	}
}

// TestLoadImageRemovesOldImages, on the real cluster: importing a new
// image of a repository removes the older one nobody imported within the
// grace period, its content included (what fills the node's disk), and
// keeps one imported within it.
func TestLoadImageRemovesOldImages(t *testing.T) {
	checkPrune(t, Require(t))
}

func checkPrune(t *testing.T, c *Cluster) {
	var b [4]byte
	_, _ = rand.Read(b[:])
	// A repository of the test's own: other test binaries import the run
	// image at the same time, and theirs must stay.
	repo := "gpupass.local/prune-test-" + hex.EncodeToString(b[:])
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	t.Cleanup(func() {
		// The test's images under every name, the CRI's (sha256:ID) too.
		out, _ := c.ctr(context.Background(), "images", "ls").Output()
		imgs := parseImages(string(out))
		ours := map[string]bool{}
		for _, img := range imgs {
			if strings.HasPrefix(img.ref, repo) {
				ours[img.digest] = true
			}
		}
		for _, img := range imgs {
			if ours[img.digest] {
				_ = c.ctr(context.Background(), "images", "rm", img.ref).Run()
			}
		}
	})
	load := func(keep time.Duration) string {
		img, err := random.Image(4096, 2)
		if err != nil {
			t.Fatal(err)
		}
		ref, err := c.loadImage(ociTar(t, img, repo+":1"), keep)
		if err != nil {
			t.Fatal(err)
		}
		return ref
	}
	images := func() []string {
		out, err := c.ctr(ctx, "images", "ls", "-q").Output()
		if err != nil {
			t.Fatal(err)
		}
		var refs []string // the test's own
		for _, ref := range strings.Fields(string(out)) {
			if strings.HasPrefix(ref, repo+"@") {
				refs = append(refs, ref)
			}
		}
		return refs
	}
	first := load(0)
	second := load(0)
	if first == second {
		t.Fatalf("two random images imported as the same %s", first)
	}
	have := images()
	if slices.Contains(have, first) || !slices.Contains(have, second) {
		t.Fatalf("after importing %s then %s, the cluster's images are %v: want the first gone, the second there", first, second, have)
	}
	_, digest, _ := strings.Cut(first, "@")
	if content, err := c.ctr(ctx, "content", "ls", "-q").Output(); err != nil {
		t.Fatal(err)
	} else if slices.Contains(strings.Fields(string(content)), digest) {
		t.Errorf("the first image's manifest %s is still in containerd's content store", digest)
	}
	third := load(ImageKeep)
	if have := images(); !slices.Contains(have, second) || !slices.Contains(have, third) {
		t.Errorf("after importing %s within ImageKeep of %s, the cluster's images are %v: want both", third, second, have)
	}
}
