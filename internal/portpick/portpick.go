// Package portpick picks a free TCP port for a job's rendezvous (the
// MASTER_PORT a launcher hands its ranks).
//
// Asking the kernel for port 0 returns a port from the ephemeral range, the
// range the kernel also draws the source ports of outgoing connections from.
// That is a trap for a rendezvous port: while rank 0 starts up, the other
// ranks dial the port again and again, and a dial whose ephemeral source
// port happens to be the rendezvous port itself connects the socket to
// itself (TCP simultaneous open) and holds the port, so rank 0 cannot bind
// it. Free therefore picks a port below the ephemeral range when it can.
//
// # Usage
//
//	port, err := portpick.Free("127.0.0.1")
package portpick

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
)

// rangeFile holds the kernel's ephemeral port range on Linux.
const rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"

// Free returns a TCP port on host that was free a moment ago, below the
// kernel's ephemeral port range if that range is known and leaves room,
// else one the kernel picks. Another process may still take the port
// before the caller's rank binds it; that race is inherent to picking a
// port for someone else.
func Free(host string) (int, error) {
	if lo, _, ok := ephemeralRange(); ok && lo > 10000 {
		// A random port in the 8192 ports below the range.
		for range 64 {
			port := lo - 1 - rand.IntN(min(8192, lo-10000))
			if free(host, port) {
				return port, nil
			}
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return 0, fmt.Errorf("portpick: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// free reports whether host:port can be listened on.
func free(host string, port int) bool {
	ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(port)))
	if err != nil {
		return false
	}
	ln.Close()
	return true
}

// ephemeralRange reads the kernel's ephemeral port range.
func ephemeralRange() (lo, hi int, ok bool) {
	b, err := os.ReadFile(rangeFile)
	if err != nil {
		return 0, 0, false
	}
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil || lo <= 0 || hi < lo {
		return 0, 0, false
	}
	return lo, hi, true
}
