package benchutil

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestCPUTime(t *testing.T) {
	a := CPUTime()
	x := 0
	for i := range 1_000_000 {
		x += i
	}
	_ = x
	assert.GreaterOrEqual(t, CPUTime(), a)
}
