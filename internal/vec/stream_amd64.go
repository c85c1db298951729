//go:build !purego

package vec

import "unsafe"

// streamCopyAVX2 copies n bytes from src to dst with non-temporal stores
// and an SFENCE: n a positive multiple of 128, dst 32-byte aligned.
//
//go:noescape
func streamCopyAVX2(dst, src *byte, n int)

// copyStream copies src into dst (of equal length, at least streamMin):
// a plain copy up to dst's first 32-byte boundary and of the last bytes
// short of 128, the rest streamed.
func copyStream(dst, src []byte) int {
	if !hasAVX2 {
		return copy(dst, src)
	}
	n := len(dst)
	a := int(-uintptr(unsafe.Pointer(unsafe.SliceData(dst))) & 31)
	m := (n - a) &^ 127
	copy(dst[:a], src[:a])
	streamCopyAVX2(&dst[a], &src[a], m)
	copy(dst[a+m:], src[a+m:])
	return n
}
