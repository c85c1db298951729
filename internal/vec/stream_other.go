//go:build !amd64 || purego

package vec

func copyStream(dst, src []byte) int { return copy(dst, src) }
