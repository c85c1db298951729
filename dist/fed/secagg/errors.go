package secagg

import (
	"errors"
	"fmt"

	"github.com/gdist/gdist/internal/errs"
)

// Errors of package secagg. Match them with errors.Is; the messages add the
// details (which client, which stage, which field).
var (
	// ErrInvalidArgument is wrapped by the errors of a bad Config or a bad
	// argument (an input of the wrong length, a NaN, a weight out of
	// range). It is the value every gdist package exports under this name
	// (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrMalformed means a message could not be decoded: too short, a bad
	// magic, a length field that disagrees with the message or with the
	// configuration, a field element out of range.
	ErrMalformed = errors.New("secagg: malformed message")
	// ErrVersion means a message of another wire version. It also matches
	// ErrMalformed.
	ErrVersion = errs.Narrow("secagg: unsupported wire version", ErrMalformed)
	// ErrRound means a message of another round (Config.Round): typically
	// a late message of an earlier round, which the caller drops.
	ErrRound = errors.New("secagg: message of another round")
	// ErrConfig means a message built with another configuration (clients,
	// threshold, dimension, quantization) than the receiver's.
	ErrConfig = errors.New("secagg: configuration mismatch")
	// ErrStage means a message or a call that does not belong to the
	// current stage: a message that arrives after its stage was closed (a
	// late client, which the round treats as dropped), one that arrives
	// early, or a Client method called out of order or after a failure.
	ErrStage = errors.New("secagg: wrong stage")
	// ErrDuplicate means a second message of the same stage from the same
	// client; the first one stands.
	ErrDuplicate = errors.New("secagg: duplicate message")
	// ErrProtocol means a well-formed message whose content breaks the
	// protocol: a sender that is not expected in this stage, a message
	// addressed to another client, a key list or survivor set that is not
	// consistent with the earlier stages, repeated public keys, a reveal
	// that does not cover exactly the clients it should.
	ErrProtocol = errors.New("secagg: protocol violation")
	// ErrAuth means an encrypted share that fails authentication: it was
	// altered on the way or not encrypted for this client.
	ErrAuth = errors.New("secagg: share authentication failed")
	// ErrTooFewClients is matched by every *TooFewError: fewer than
	// Threshold clients remain at some stage, and the round fails.
	ErrTooFewClients = errors.New("secagg: too few clients")
	// ErrBadShare means the revealed shares of a secret do not reconstruct
	// it: the secret key does not match its public key, or the self-mask
	// seed does not match its commitment. Some client revealed a wrong
	// share; the round fails.
	ErrBadShare = errors.New("secagg: shares do not reconstruct the secret")
)

// TooFewError reports a stage that ended with fewer clients than the
// threshold: the round cannot go on (a sum of fewer than Threshold inputs
// would reveal too much, and fewer shares cannot reconstruct the masks).
type TooFewError struct {
	Stage Stage // the stage that ended short
	Have  int   // clients heard from in that stage
	Need  int   // Config.Threshold
}

func (e *TooFewError) Error() string {
	return fmt.Sprintf("secagg: %v: %d clients, the threshold is %d", e.Stage, e.Have, e.Need)
}

// Unwrap returns ErrTooFewClients.
func (e *TooFewError) Unwrap() error { return ErrTooFewClients }
