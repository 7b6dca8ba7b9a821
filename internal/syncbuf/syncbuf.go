// Package syncbuf is a buffer that goroutines or a child process write
// while a test reads it: a log sink for assertions.
package syncbuf

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer behind a mutex; the zero value is empty and
// ready to use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String is what was written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// Reset forgets what was written.
func (w *Buffer) Reset() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b.Reset()
}
