// Package cnibench is napitap-bench cnibench.
package cnibench

import "errors"

// Main runs the benchmark with command-line args.
func Main(args []string) error { return errors.New("not implemented yet") }
