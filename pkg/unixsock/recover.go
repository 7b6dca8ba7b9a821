package unixsock

import (
	"log/slog"
	"runtime/debug"
)

// LogPanic, deferred at the top of a goroutine that serves one peer, turns
// a panic into a log line: the daemon holds every VM's queues and seccomp
// listeners, so no one connection may take it down.
func LogPanic(log *slog.Logger, msg string, args ...any) {
	if r := recover(); r != nil {
		log.Error(msg, append(args, "panic", r, "stack", string(debug.Stack()))...)
	}
}
