package vec

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestCopyStreamIsCopy: CopyStream leaves dst as copy does and returns
// its count, over lengths around the streaming threshold and the kernel's
// 128-byte blocks, every alignment of dst and src within 32 bytes, and
// dst and src of different lengths; the bytes around dst are untouched.
func TestCopyStreamIsCopy(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	src := make([]byte, 3<<20+64)
	for i := range src {
		src[i] = byte(rng.Uint32())
	}
	lengths := []int{0, 1, 31, 127, 128, streamMin - 1, streamMin, streamMin + 1, streamMin + 127,
		4096, 4096 + 31, 65536 + 77, 1 << 20, 3 << 20}
	check := func(t *testing.T, n, m, da, sa int) {
		buf := make([]byte, n+da+64)
		for i := range buf {
			buf[i] = 0xA5
		}
		dst := buf[da : da+n]
		want := min(n, m)
		require.Equal(t, want, CopyStream(dst, src[sa:sa+m]))
		require.Equal(t, src[sa:sa+want], dst[:want], "n %d m %d dst+%d src+%d", n, m, da, sa)
		for i, b := range buf[:da] {
			require.Equal(t, byte(0xA5), b, "before dst: %d", i)
		}
		for i, b := range buf[da+want:] {
			require.Equal(t, byte(0xA5), b, "after the copy: %d", i)
		}
	}
	for _, n := range lengths {
		for _, da := range []int{0, 1, 7, 8, 16, 31} {
			for _, sa := range []int{0, 3, 32} {
				check(t, n, n, da, sa)
			}
		}
		check(t, n, n/2, 5, 1) // src shorter
		check(t, n/2, n, 5, 1) // dst shorter
	}
	if restore := forcePortable(); restore != nil { // the portable path
		defer restore()
		check(t, 65536+77, 65536+77, 3, 1)
	}
}

func BenchmarkCopyStream(b *testing.B) {
	for _, n := range []int{32 << 10, 256 << 10, 4 << 20} {
		src, dst := make([]byte, n), make([]byte, n)
		b.Run(sizeName(n)+"/copy", func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				copy(dst, src)
			}
		})
		b.Run(sizeName(n)+"/stream", func(b *testing.B) {
			b.SetBytes(int64(n))
			for b.Loop() {
				CopyStream(dst, src)
			}
		})
	}
}

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%dMiB", n>>20)
	}
	return fmt.Sprintf("%dKiB", n>>10)
}
