//go:build cgo

package ownuserns

/*
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

// Runs from the ELF constructors, before the Go runtime: the process has
// one thread. A failure ends it, so that a test never mistakes a process
// in the initial user namespace for the attacker.
__attribute__((constructor)) static void napitap_own_userns(void) {
	const char *v = getenv("NAPITAP_OWN_USERNS");
	if (v == NULL || strcmp(v, "1") != 0)
		return;
	if (unshare(CLONE_NEWUSER) != 0) {
		perror("ownuserns: unshare(CLONE_NEWUSER)");
		_exit(97);
	}
}
*/
import "C"
