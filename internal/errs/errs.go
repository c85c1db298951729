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

// Narrow returns a sentinel error whose message is msg and that also matches
// (errors.Is) parent: a narrower cause of a broader failure, such as a
// transport's heartbeat timeout, which is one way for a peer to stop
// responding. Code that knows only the broader sentinel classifies it
// without importing the package that defines the narrower one.
func Narrow(msg string, parent error) error { return &narrow{msg: msg, parent: parent} }

type narrow struct {
	msg    string
	parent error
}

func (e *narrow) Error() string { return e.msg }
func (e *narrow) Unwrap() error { return e.parent }
