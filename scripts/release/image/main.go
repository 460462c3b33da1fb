// Command image builds and pushes the container image of one gpupass
// binary, as ko does, with no Docker: the statically built binary for each
// platform on a base, the config set by internal/ociimage, an index when
// there are several platforms, pushed by digest. It prints the pushed
// reference (repository@sha256:…), which the release stamps into the
// GitLab components (scripts/release/gitlab-catalog.sh).
//
//	go run ./scripts/release/image --repository ghcr.io/gpupass/gpupass --tag 1.2.3 \
//	  --name gpupass --binary linux/amd64=out/amd64/gpupass --binary linux/arm64=out/arm64/gpupass \
//	  --base empty --ca-certs /etc/ssl/certs/ca-certificates.crt \
//	  --source https://github.com/gpupass/gpupass --version v1.2.3 --revision "$GITHUB_SHA"
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/gpupass/gpupass/internal/ociimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("image", flag.ContinueOnError)
	var (
		binaries, tags            list
		repo, bin, base, caCerts  string
		source, version, revision string
		plainHTTP                 bool
	)
	fs.StringVar(&repo, "repository", "", "repository to push to, e.g. ghcr.io/gpupass/gpupass")
	fs.Var(&tags, "tag", "tag to point at the pushed digest (repeatable), e.g. 1.2.3")
	fs.StringVar(&bin, "name", "", "binary name in the image (/usr/local/bin/NAME, the entrypoint), e.g. gpupass")
	fs.Var(&binaries, "binary", "OS/ARCH=PATH of a statically linked binary (repeatable; several make an index)")
	fs.StringVar(&base, "base", "empty", "base image: empty, an image tarball (.tar), or a reference (pin it by digest)")
	fs.StringVar(&caCerts, "ca-certs", "", "CA bundle to add at "+ociimage.CACertsPath+" (for the empty base)")
	fs.StringVar(&source, "source", "", "org.opencontainers.image.source label (the repository URL)")
	fs.StringVar(&version, "version", "", "org.opencontainers.image.version label")
	fs.StringVar(&revision, "revision", "", "org.opencontainers.image.revision label (the commit)")
	fs.BoolVar(&plainHTTP, "plain-http", false, "plain HTTP to a loopback test registry")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if repo == "" || bin == "" || len(binaries) == 0 {
		return errors.New("--repository, --name and at least one --binary OS/ARCH=PATH are required")
	}
	created := time.Unix(0, 0)
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		sec, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH %q: want seconds since the epoch", s)
		}
		created = time.Unix(sec, 0)
	}
	var certs []byte
	if caCerts != "" {
		b, err := os.ReadFile(caCerts)
		if err != nil {
			return fmt.Errorf("--ca-certs: %w", err)
		}
		certs = b
	}
	var imgs []v1.Image
	for _, b := range binaries {
		plat, file, ok := strings.Cut(b, "=")
		if !ok {
			return fmt.Errorf("--binary %q: want OS/ARCH=PATH, e.g. linux/amd64=dist/gpupass", b)
		}
		p, err := v1.ParsePlatform(plat)
		if err != nil || p.OS == "" || p.Architecture == "" {
			return fmt.Errorf("--binary %q: platform %q: want OS/ARCH such as linux/amd64", b, plat)
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return fmt.Errorf("--binary %s: %w", plat, err)
		}
		baseImg, err := ociimage.Base(ctx, base, *p)
		if err != nil {
			return fmt.Errorf("--base: %w", err)
		}
		img, err := ociimage.Build(baseImg, ociimage.Spec{Name: bin, Binary: data, Platform: *p, CACerts: certs,
			Source: source, Version: version, Revision: revision, Created: created})
		if err != nil {
			return fmt.Errorf("--binary %s: %w", plat, err)
		}
		imgs = append(imgs, img)
	}
	var push remote.Taggable = imgs[0]
	if len(imgs) > 1 {
		idx, err := ociimage.Index(imgs...)
		if err != nil {
			return err
		}
		push = idx
	}
	ref, err := ociimage.Push(ctx, ociimage.PushOptions{Repository: repo, Tags: tags, PlainHTTP: plainHTTP}, push)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(out, ref)
	return err
}
