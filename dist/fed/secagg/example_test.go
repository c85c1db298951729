package secagg_test

import (
	"fmt"
	"log"

	"github.com/gdist/gdist/dist/fed/secagg"
)

// Three clients send weighted vectors; client 3 goes offline after
// sharing its keys, before its input. The server learns the weighted sum
// of clients 1 and 2 and their total weight, and nothing else.
func Example() {
	cfg := secagg.Config{Round: 1, Clients: []int{1, 2, 3}, Threshold: 2, Dim: 3, Clip: 10, MaxWeight: 100}
	inputs := map[int][]float64{1: {1, 2, 3}, 2: {4, 5, 6}, 3: {7, 8, 9}}
	weights := map[int]uint64{1: 10, 2: 30, 3: 60} // sample counts

	server, err := secagg.NewServer(cfg)
	check(err)
	clients := map[int]*secagg.Client{}
	for _, id := range cfg.Clients {
		clients[id], err = secagg.NewClient(cfg, id, nil) // keys from crypto/rand
		check(err)
	}

	// Stage 1: each client advertises its public keys.
	for id, c := range clients {
		msg, err := c.AdvertiseKeys()
		check(err)
		check(server.Receive(id, msg))
	}
	out, err := server.Advance() // a key list for each client
	check(err)

	// Stage 2: each client shares its secrets, encrypted for each other.
	for id, msg := range out {
		reply, err := clients[id].ShareKeys(msg)
		check(err)
		check(server.Receive(id, reply))
	}
	out, err = server.Advance() // the shares forwarded to each client
	check(err)

	// Stage 3: masked inputs; client 3 is gone.
	for id, msg := range out {
		if id == 3 {
			continue
		}
		reply, err := clients[id].MaskInput(msg, inputs[id], weights[id])
		check(err)
		check(server.Receive(id, reply))
	}
	fmt.Println("waiting for", server.Pending())
	out, err = server.Advance() // the survivor list for clients 1 and 2
	check(err)

	// Stage 4: the survivors reveal the shares that remove the masks.
	for id, msg := range out {
		reply, err := clients[id].Unmask(msg)
		check(err)
		check(server.Receive(id, reply))
	}
	_, err = server.Advance()
	check(err)

	res, err := server.Sum()
	check(err)
	fmt.Println("clients", res.Clients, "weight", res.Weight)
	fmt.Printf("weighted mean %.3f\n", res.Mean())
	// Output:
	// waiting for [3]
	// clients [1 2] weight 40
	// weighted mean [3.250 4.250 5.250]
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
