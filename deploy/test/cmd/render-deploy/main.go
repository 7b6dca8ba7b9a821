// render-deploy writes deploy/ rendered with an image, for
// `make deploy-manifests IMAGE=...`:
//
//	render-deploy --image REGISTRY/napitap:TAG --dir deploy > napitap.yaml
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/napitap/napitap/deploy/test/manifests"
)

func main() {
	image := flag.String("image", "", "the image the DaemonSet runs (name:tag or name@digest)")
	dir := flag.String("dir", "deploy", "the kustomization to render")
	out := flag.String("o", "-", "output file (- for stdout)")
	flag.Parse()
	if *image == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	y, err := manifests.Render(*dir, *image)
	if err == nil {
		if *out == "-" {
			_, err = os.Stdout.Write(y)
		} else {
			err = os.WriteFile(*out, y, 0o644)
		}
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "render-deploy:", err)
		os.Exit(1)
	}
}
