// Command k8s-image builds a container image for the local Kubernetes
// test cluster from this Debian machine's installed files
// (internal/debimage), cached by content key, and prints the OCI layout
// tarball's path and the manifest digest:
//
//	go run ./scripts/k8s-image --cache DIR --name gpupass.local/pause:1 --busybox \
//	  --entrypoint /bin/sleep --entrypoint 2147483647
//
// scripts/k8s-up.sh uses it for the sandbox (pause) and busybox images,
// and with --run-image for the default run image (python3, torch, numpy,
// the agent at --agent: debimage.RunImageSpec, as the tests build it):
//
//	go run ./scripts/k8s-image --cache DIR --run-image --agent bin/gpupass-agent
package main

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"

	"github.com/gpupass/gpupass/internal/debimage"
)

type list []string

func (l *list) String() string     { return strings.Join(*l, ",") }
func (l *list) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "k8s-image:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("k8s-image", flag.ContinueOnError)
	var pkgs, files, entry, cmd list
	cache := fs.String("cache", "", "directory the image tarballs are cached in")
	name := fs.String("name", "", "image name with tag")
	runImage := fs.Bool("run-image", false, "build the default run image (debimage.RunImageSpec); --name and the image flags are not used")
	agent := fs.String("agent", "", "with --run-image: the gpupass-agent binary to put in the image")
	busybox := fs.Bool("busybox", false, "add /bin/busybox (busybox-static) with a /bin symlink for each applet")
	fs.Var(&pkgs, "package", "Debian package whose installed closure goes in (repeatable)")
	fs.Var(&files, "file", "DST=SRC: copy SRC from this machine to DST in the image (repeatable)")
	fs.Var(&entry, "entrypoint", "one entrypoint argument (repeatable)")
	fs.Var(&cmd, "cmd", "one cmd argument (repeatable)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *cache == "" {
		return fmt.Errorf("--cache is required")
	}
	if *runImage {
		spec, err := debimage.RunImageSpec(*cache, *agent)
		if err != nil {
			return err
		}
		return build(*cache, spec)
	}
	spec := debimage.Spec{
		Name: *name, Packages: pkgs, Files: map[string]string{}, Symlinks: map[string]string{},
		Entrypoint: entry, Cmd: cmd, TmpDirs: []string{"/tmp"},
		Env: []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	}
	for _, f := range files {
		dst, src, ok := strings.Cut(f, "=")
		if !ok {
			return fmt.Errorf("--file %q: want DST=SRC", f)
		}
		spec.Files[dst] = src
	}
	if *busybox {
		spec.Files["/bin/busybox"] = "/bin/busybox"
		out, err := exec.Command("/bin/busybox", "--list").Output()
		if err != nil {
			return fmt.Errorf("busybox --list (apt-get install busybox-static): %w", err)
		}
		for _, a := range strings.Fields(string(out)) {
			if a != "busybox" {
				spec.Symlinks["/bin/"+a] = "busybox"
			}
		}
	}
	return build(*cache, spec)
}

// build builds spec into cache and prints the tarball's path and the
// manifest digest.
func build(cache string, spec debimage.Spec) error {
	r, err := debimage.Build(cache, spec)
	if err != nil {
		return err
	}
	fmt.Println(r.Path, r.Digest)
	return nil
}
