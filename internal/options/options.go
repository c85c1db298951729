// Package options applies functional options, in the one shape every gdist
// constructor uses: type Option func(*config) error, validated when the
// constructor applies it (grpc-go's dialoptions is the model).
//
// # Usage
//
//	type Option func(*config) error
//
//	func New(opts ...Option) (*T, error) {
//		cfg := defaultConfig()
//		if err := options.Apply(&cfg, opts, "pkg", ErrInvalidArgument); err != nil {
//			return nil, err
//		}
//		...
//	}
package options

import "fmt"

// Apply applies opts to cfg in order and returns the first error an option
// returns (options name themselves in their errors). A nil option is refused
// with an error that wraps invalid, names its position and starts with
// prefix (the package name).
func Apply[C any, O ~func(*C) error](cfg *C, opts []O, prefix string, invalid error) error {
	for i, o := range opts {
		if o == nil {
			return fmt.Errorf("%s: option %d is nil: %w", prefix, i, invalid)
		}
		if err := o(cfg); err != nil {
			return err
		}
	}
	return nil
}
