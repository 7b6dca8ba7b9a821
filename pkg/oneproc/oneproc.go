// Package oneproc, imported for its side effect, runs a short-lived
// program on one P (GOMAXPROCS 1) from the first package inits on.
//
// A CNI verb or a napitapctl command is a short run of system calls, one
// after the other: a second P only makes the runtime start and wake
// threads for it, CPU that a burst of pods on a node waits for (issue 46;
// docs/bench/cni.md). Set here rather than in main, the inits run on one
// P too, and the runtime has less to stop and hand back when it drops the
// second (runtime.GOMAXPROCS stops the world). Go initializes a package
// that imports only the runtime among the first (the spec's
// initialization order sorts the ready packages by import path).
// GOMAXPROCS=1 in the environment would start the runtime on one P, but a
// plugin's environment is its runtime's.
package oneproc

import "runtime"

func init() { runtime.GOMAXPROCS(1) }
