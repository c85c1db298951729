package hybrid

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"strings"
)

// DefaultHostID returns the host identity Rendezvous uses unless
// WithHostID replaces it: the kernel's boot id
// (/proc/sys/kernel/random/boot_id), the host name and the network
// namespace (/proc/self/ns/net), those of them the system has. Two
// processes with the same identity run on one boot of one machine and can
// reach each other's abstract Unix sockets; processes in different
// network namespaces of one machine (containers, the deploy/netns test)
// get different identities and use TCP. With none of the three available
// the identity is random: the process is a host of its own.
func DefaultHostID() string {
	var parts []string
	if b, err := os.ReadFile("/proc/sys/kernel/random/boot_id"); err == nil {
		parts = append(parts, "boot="+strings.TrimSpace(string(b)))
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		parts = append(parts, "host="+h)
	}
	if ns, err := os.Readlink("/proc/self/ns/net"); err == nil {
		parts = append(parts, "netns="+ns)
	}
	if len(parts) == 0 {
		var b [16]byte
		rand.Read(b[:])
		parts = append(parts, "random="+hex.EncodeToString(b[:]))
	}
	id := strings.Join(parts, " ")
	if len(id) > MaxHostID {
		id = id[:MaxHostID]
	}
	return id
}
