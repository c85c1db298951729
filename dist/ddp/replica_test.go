package ddp_test

import (
	"context"
	"encoding/binary"
	"errors"
	"hash/fnv"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/dist"
	"github.com/gdist/gdist/dist/ddp"
	"github.com/gdist/gdist/dist/disttest"
)

func TestChecksumWidths(t *testing.T) {
	v32 := []float32{1.5, -2, 0.25}
	h := fnv.New64a()
	for _, x := range v32 {
		h.Write(binary.LittleEndian.AppendUint32(nil, math.Float32bits(x)))
	}
	c := ddp.ChecksumFloat32s([][]float32{v32[:1], v32[1:]})
	assert.Equal(t, ddp.Checksum{Sum: -0.25, SumSq: 1.5*1.5 + 4 + 0.0625, Hash: h.Sum64()}, c)

	v64 := []float64{1.5, -2, 0.25}
	c64 := ddp.ChecksumFloat64s([][]float64{v64})
	assert.Equal(t, c.Sum, c64.Sum)
	assert.NotEqual(t, c.Hash, c64.Hash, "float32 hashes 4 bytes an element")
	wide := ddp.Accumulator{Widen: true}
	wide.Float32s(v32)
	assert.Equal(t, c64, wide.Checksum(), "Widen hashes float32 as float64")

	g := gorgonia.NewGraph()
	n32 := gorgonia.NewVector(g, tensor.Float32, gorgonia.WithShape(3), gorgonia.WithValue(tensor.New(tensor.WithBacking(append([]float32(nil), v32...)))))
	got, err := ddp.ChecksumOf([]*gorgonia.Node{n32})
	require.NoError(t, err)
	assert.Equal(t, c, got)
	var a ddp.Accumulator
	assert.Error(t, a.Add([]int{1}))
}

// TestSame checks the divergence check itself: a rank with a different
// checksum makes every rank report a difference.
func TestSame(t *testing.T) {
	base := ddp.Checksum{Sum: 1.5, SumSq: 2, Hash: 0xdeadbeefcafef00d}
	for _, tc := range []struct {
		name string
		c1   ddp.Checksum
		want bool
	}{
		{"equal", base, true},
		{"sum", ddp.Checksum{Sum: math.Nextafter(1.5, 2), SumSq: 2, Hash: 0xdeadbeefcafef00d}, false},
		{"hash low bit", ddp.Checksum{Sum: 1.5, SumSq: 2, Hash: 0xdeadbeefcafef00c}, false},
		{"hash high bit", ddp.Checksum{Sum: 1.5, SumSq: 2, Hash: 0x5eadbeefcafef00d}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, errs := disttest.Results(t, disttest.Cluster(t, 2), func(rank int, pg *dist.ProcessGroup) (bool, error) {
				c := base
				if rank == 1 {
					c = tc.c1
				}
				return ddp.SameReplicas(context.Background(), pg, c)
			})
			require.NoError(t, errors.Join(errs...))
			assert.Equal(t, []bool{tc.want, tc.want}, got)
		})
	}
}
