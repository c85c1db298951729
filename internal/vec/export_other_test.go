//go:build !amd64 || purego

package vec

// forcePortable: the portable kernels are the only ones.
func forcePortable() func() { return func() {} }
