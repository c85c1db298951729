package benchutil

import (
	"os"
	"strings"
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

func TestLoadAvg(t *testing.T) {
	if _, err := os.Stat("/proc/loadavg"); err != nil {
		assert.Equal(t, "n/a", LoadAvg())
		return
	}
	assert.Len(t, strings.Fields(LoadAvg()), 3)
}
