//go:build !cgo

package ownuserns

import (
	"fmt"
	"os"
)

func init() {
	if os.Getenv(Env) == "1" {
		fmt.Fprintln(os.Stderr, "ownuserns: built without cgo, cannot unshare before the runtime starts")
		os.Exit(97)
	}
}
