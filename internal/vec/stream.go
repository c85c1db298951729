package vec

// streamMin is the shortest copy CopyStream streams; shorter ones are
// plain copies.
const streamMin = 1 << 10

// CopyStream copies src into dst as copy does and returns the number of
// bytes copied, min(len(dst), len(src)). On amd64 with AVX2 a copy of
// streamMin bytes or more writes dst with non-temporal stores, which go
// to memory past the caches instead of first reading dst's cache lines
// in (and taking them from any other core's cache that holds them), and
// fences them (SFENCE) before it returns: a store that publishes dst to
// another thread or process afterwards orders after them. Elsewhere, and
// for shorter copies, it is copy. dst and src must not overlap.
//
// It pays where another core reads dst next and shares no cache with
// this one (on the far side of a chip's interconnect): a plain copy then
// fetches every line of dst from that core's cache before writing it. It
// costs where the two cores share a cache, or this core reads dst again.
func CopyStream(dst, src []byte) int {
	n := min(len(dst), len(src))
	if n < streamMin {
		return copy(dst, src)
	}
	return copyStream(dst[:n], src[:n])
}
