// Package ownuserns, imported by a test binary, lets it run as the attacker
// of DESIGN.md fact 25: with NAPITAP_OWN_USERNS=1 in its environment, the
// process calls unshare(CLONE_NEWUSER) before Go's runtime starts a second
// thread (the kernel refuses it to a multithreaded process), and goes on in
// that user namespace of its own, unmapped and without an exec (an exec
// there would drop the capabilities). /proc/PID/status then shows every
// capability, and SO_PEERCRED still says uid 0.
package ownuserns

// Env is the variable that asks for a user namespace of the process's own.
const Env = "NAPITAP_OWN_USERNS"
