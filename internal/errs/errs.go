// Package errs holds the error values every gdist package shares. It is on
// the ground floor: it imports nothing of the project, so any package may
// import it.
//
// # Usage
//
// A package re-exports the shared value under its own name and wraps it
// with its own prefix, so that callers match one value whichever package
// refused their argument:
//
//	// ErrInvalidArgument is matched by the errors of a bad argument or option.
//	var ErrInvalidArgument = errs.ErrInvalidArgument
//
//	return fmt.Errorf("tcp: %w: WithMaxFrame(%d): must be positive", ErrInvalidArgument, n)
//
// and callers test errors.Is(err, tcp.ErrInvalidArgument), or the same
// value under any other package's name.
package errs

import "errors"

// ErrInvalidArgument is matched (errors.Is) by every gdist error about a bad
// argument or option value: a negative size, a nil option, an option that
// does not apply to the constructor it was given to. Each package exports it
// as its own ErrInvalidArgument.
var ErrInvalidArgument = errors.New("gdist: invalid argument")
