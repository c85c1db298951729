package portpick

import (
	"net"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFreeIsBelowTheEphemeralRange(t *testing.T) {
	for range 20 {
		port, err := Free("127.0.0.1")
		require.NoError(t, err)
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		require.NoError(t, err, "the port is free")
		ln.Close()
		if lo, _, ok := ephemeralRange(); ok && lo > 10000 {
			assert.Less(t, port, lo, "below the ephemeral range")
			assert.GreaterOrEqual(t, port, lo-8192)
		}
	}
}

func TestFreeOnAnotherHostFails(t *testing.T) {
	_, err := Free("192.0.2.1") // TEST-NET-1: not an address of this host
	assert.Error(t, err)
}
