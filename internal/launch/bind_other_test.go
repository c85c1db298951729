//go:build !linux

package launch

func threadCPUs() []string { return nil }
