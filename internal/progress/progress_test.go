package progress

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestEMA(t *testing.T) {
	var e EMA
	assert.Equal(t, 2.0, e.Add(2))
	assert.InDelta(t, 2.0+0.05*(4-2), e.Add(4), 1e-15)
}

func TestMilestones(t *testing.T) {
	m := Milestones{Parts: 4}
	var due []int
	for i := 1; i <= 10; i++ {
		if m.Due(i, 10) {
			due = append(due, i)
		}
	}
	assert.Equal(t, []int{3, 5, 8}, due)

	f := Milestones{Parts: 10}
	var fd []float64
	for _, x := range []float64{0.05, 0.1, 0.35, 0.36, 0.9, 0.95, 1} {
		if f.DueFrac(x) {
			fd = append(fd, x)
		}
	}
	assert.Equal(t, []float64{0.1, 0.35, 0.9}, fd)
}

func TestIsTerminal(t *testing.T) {
	assert.False(t, IsTerminal(&bytes.Buffer{}))
}

func TestNewBar(t *testing.T) {
	var buf bytes.Buffer
	b := NewBar(&buf, 10, "x", "samples")
	_ = b.Add(10)
	assert.NoError(t, b.Finish())
}
