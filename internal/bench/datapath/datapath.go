// Package datapath is napitap-bench datapath.
package datapath

import "errors"

// Main runs the benchmark with command-line args.
func Main(args []string) error { return errors.New("not implemented yet") }
