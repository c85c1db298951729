package transporttest

import (
	"bytes"
	"sync"
)

// LogBuffer is a bytes.Buffer safe for concurrent use, for tests that give
// a transport or group a logger (slog.NewTextHandler(&buf, nil)) and read
// what it wrote while its goroutines may still write.
type LogBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Write appends p.
func (l *LogBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

// String returns everything written so far.
func (l *LogBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
