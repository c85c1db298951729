//go:build linux

package shm_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/shm"
)

// Two ranks (here goroutines of one process; normally two processes on
// one host) meet under an abstract socket name and exchange a message
// through shared memory.
func ExampleRendezvous() {
	var b [8]byte
	rand.Read(b[:])
	name := "@gdist-example-" + hex.EncodeToString(b[:]) // unique to the job
	tok := []byte("job token")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	ts := make([]*shm.Transport, 2)
	var wg sync.WaitGroup
	for rank := range 2 {
		wg.Go(func() {
			tr, err := shm.Rendezvous(ctx, rank, 2, name, shm.WithToken(tok))
			if err != nil {
				panic(err)
			}
			ts[rank] = tr
		})
	}
	wg.Wait()
	defer ts[0].Close()
	defer ts[1].Close()

	if err := ts[0].Send(ctx, 1, 7, transport.Header{}, []byte("hello over shared memory")); err != nil {
		panic(err)
	}
	buf := make([]byte, 64)
	_, n, err := ts[1].RecvInto(ctx, 0, 7, buf)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(buf[:n]))
	// Output: hello over shared memory
}
