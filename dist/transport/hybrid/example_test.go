//go:build linux

package hybrid_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/gdist/gdist/dist/transport"
	"github.com/gdist/gdist/dist/transport/hybrid"
)

// Four ranks (goroutines of one process here; normally processes) on two
// simulated hosts, A and B: ranks of one host talk through shared memory
// (on Linux), the others through TCP.
func ExampleRendezvous() {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // find a free port for rank 0
	if err != nil {
		panic(err)
	}
	master := ln.Addr().String()
	ln.Close()
	tok := []byte("0123456789abcdef0123456789abcdef") // the job token
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	ts := make([]*hybrid.Transport, 4)
	var wg sync.WaitGroup
	for rank, host := range []string{"A", "A", "B", "B"} {
		wg.Go(func() {
			tr, err := hybrid.Rendezvous(ctx, rank, 4, master, hybrid.WithToken(tok), hybrid.WithHostID(host))
			if err != nil {
				panic(err)
			}
			ts[rank] = tr
		})
	}
	wg.Wait()
	defer func() {
		for _, tr := range ts {
			tr.Close()
		}
	}()

	fmt.Println("hosts:", ts[3].Hosts())
	fmt.Println("rank 0 reaches rank 1 via", ts[0].Via(1), "and rank 2 via", ts[0].Via(2))
	if err := ts[0].Send(ctx, 1, 7, transport.Header{}, []byte("hello, neighbour")); err != nil {
		panic(err)
	}
	m, err := ts[1].Recv(ctx, 0, 7)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(m.Payload))
	// Output:
	// hosts: [0 0 1 1]
	// rank 0 reaches rank 1 via shm and rank 2 via tcp
	// hello, neighbour
}
