package testenv

import (
	"bytes"
	"sync"
)

// Buffer is a bytes.Buffer for output written by one goroutine (a child process's
// stdout through exec.Cmd, a logger) while the test reads it from another.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *Buffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// String returns what was written so far.
func (w *Buffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}
