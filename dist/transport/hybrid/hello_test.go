package hybrid

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestHelloRoundTrip(t *testing.T) {
	for _, h := range []hello{
		{mode: Auto, shm: true, hostID: "boot=1 host=a netns=net:[1]"},
		{mode: SHM, session: [sessionSize]byte{1, 2, 3}, hostID: "x"},
		{mode: TCP, hostID: string(make([]byte, MaxHostID))},
	} {
		got, err := parseHello(h.marshal())
		require.NoError(t, err)
		assert.Equal(t, h, got)
	}
}

// FuzzParseHello: parsing any bytes either fails with ErrProtocol or gives
// a hello that marshals back to the same bytes.
func FuzzParseHello(f *testing.F) {
	f.Add((&hello{mode: Auto, shm: true, hostID: "A"}).marshal())
	f.Add((&hello{mode: SHM, session: [sessionSize]byte{9}, hostID: "host"}).marshal())
	f.Add([]byte("gdsthyb1"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseHello(b)
		if err != nil {
			require.ErrorIs(t, err, ErrProtocol)
			return
		}
		require.Equal(t, b, h.marshal())
	})
}
