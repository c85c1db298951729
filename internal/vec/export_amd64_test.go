//go:build !purego

package vec

// forcePortable makes AddF32 and AddF64 use the portable kernels until the
// returned function is called.
func forcePortable() func() {
	old := hasAVX2
	hasAVX2 = false
	return func() { hasAVX2 = old }
}
