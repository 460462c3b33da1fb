package k8stest

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ImageKeep is how long an image imported into the cluster stays after
// its last import once a newer image of its repository is imported: long
// enough for every test binary of a `go test` run that imported it to be
// done with it (they run at once, and each imports the run image with its
// own agent binary), short enough that a long-lived cluster does not fill
// its disk (a run image is ~1.3 GB; 27 GB of them once failed the node's
// storage.free check). An image a container uses stays whatever its age.
const ImageKeep = 30 * time.Minute

// labelImported is the containerd label with the Unix time of an
// image's last import (LoadImage).
const labelImported = "gpupass.test/imported"

// ctrImage is an image name in the cluster's containerd.
type ctrImage struct {
	ref string
	// digest is its target, the manifest's digest: the names of one
	// image (REPO@sha256:…, REPO:TAG, the CRI's sha256:ID) share it.
	digest string
	// imported is its last import (zero: imported before the label).
	imported time.Time
}

// parseImages reads `ctr images ls`: a header, then REF TYPE DIGEST SIZE
// (two words) PLATFORMS LABELS, the labels k=v,k=v or "-".
func parseImages(out string) []ctrImage {
	var imgs []ctrImage
	for i, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if i == 0 || len(f) < 4 {
			continue
		}
		img := ctrImage{ref: f[0], digest: f[2]}
		for _, kv := range strings.Split(f[len(f)-1], ",") {
			if v, ok := strings.CutPrefix(kv, labelImported+"="); ok {
				if s, err := strconv.ParseInt(v, 10, 64); err == nil {
					img.imported = time.Unix(s, 0)
				}
			}
		}
		imgs = append(imgs, img)
	}
	return imgs
}

// parseContainerImages reads `ctr containers ls`: a header, then
// CONTAINER IMAGE RUNTIME; the image names the containers use.
func parseContainerImages(out string) []string {
	var imgs []string
	for i, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); i > 0 && len(f) >= 2 {
			imgs = append(imgs, f[1])
		}
	}
	return imgs
}

// stale is which image names to remove: the images of keep's repository
// (REPO@sha256:…) other than keep, which no container uses and nobody
// imported within grace before now, with every other name of theirs in
// the repository or the CRI's (sha256:ID): content stays while any name
// holds it. A container names its image as the pod did or by a tag that
// may have moved on to a newer image since, so in-use is known only for
// what its name now points at; grace covers the rest.
func stale(imgs []ctrImage, keep string, used []string, now time.Time, grace time.Duration) []string {
	repo, _, _ := strings.Cut(keep, "@")
	digestOf := map[string]string{}
	for _, img := range imgs {
		digestOf[img.ref] = img.digest
	}
	inUse := map[string]bool{digestOf[keep]: true}
	for _, name := range used {
		inUse[digestOf[name]] = true
	}
	gone := map[string]bool{}
	for _, img := range imgs {
		if strings.HasPrefix(img.ref, repo+"@sha256:") && !inUse[img.digest] && now.Sub(img.imported) > grace {
			gone[img.digest] = true
		}
	}
	var refs []string
	for _, img := range imgs {
		if gone[img.digest] && (strings.HasPrefix(img.ref, repo+"@") || strings.HasPrefix(img.ref, repo+":") || strings.HasPrefix(img.ref, "sha256:")) {
			refs = append(refs, img.ref)
		}
	}
	return refs
}

// pruneImages labels keep (REPO@sha256:...) as imported now and removes
// the other images of its repository that are stale, returning them:
// content and snapshots no image names any more are then garbage
// collected by containerd (ctr images rm --sync waits for it).
func (c *Cluster) pruneImages(ctx context.Context, keep string, grace time.Duration) ([]string, error) {
	if !strings.Contains(keep, "@sha256:") {
		return nil, fmt.Errorf("%s is not pinned by digest", keep)
	}
	now := time.Now()
	if b, err := c.ctr(ctx, "images", "label", keep, labelImported+"="+strconv.FormatInt(now.Unix(), 10)).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("ctr images label %s: %v: %s", keep, err, b)
	}
	ls, err := c.ctr(ctx, "images", "ls").Output()
	if err != nil {
		return nil, fmt.Errorf("ctr images ls: %w", err)
	}
	cs, err := c.ctr(ctx, "containers", "ls").Output()
	if err != nil {
		return nil, fmt.Errorf("ctr containers ls: %w", err)
	}
	refs := stale(parseImages(string(ls)), keep, parseContainerImages(string(cs)), now, grace)
	if len(refs) == 0 {
		return nil, nil
	}
	// Another test binary may remove the same image at once: one gone
	// already is no error.
	if b, err := c.ctr(ctx, append([]string{"images", "rm", "--sync"}, refs...)...).CombinedOutput(); err != nil && !strings.Contains(string(b), "not found") {
		return nil, fmt.Errorf("ctr images rm %s: %v: %s", strings.Join(refs, " "), err, b)
	}
	return refs, nil
}
