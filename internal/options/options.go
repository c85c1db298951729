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

// NoNil refuses a list of options that holds a nil one, with an error that
// wraps invalid, names its position and starts with prefix (the package
// and the option that takes the list: "gdist: WithTCPOptions"). It is for
// an option that hands a list on to another constructor
// (WithTCPOptions(opts ...tcp.Option)), so that a nil one is refused when
// that option is applied, as Apply would refuse it.
func NoNil[C any, O ~func(*C) error](prefix string, opts []O, invalid error) error {
	for i, o := range opts {
		if o == nil {
			return fmt.Errorf("%s: option %d is nil: %w", prefix, i, invalid)
		}
	}
	return nil
}
