package benchutil

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFreePort(t *testing.T) {
	p, err := FreePort()
	require.NoError(t, err)
	assert.Positive(t, p)
}

func TestCPUTime(t *testing.T) {
	a := CPUTime()
	x := 0
	for i := range 1_000_000 {
		x += i
	}
	_ = x
	assert.GreaterOrEqual(t, CPUTime(), a)
}
