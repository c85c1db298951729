// Package envconf parses the GDIST_* variables that configure a job's
// links — durations, sizes, the heartbeat, TLS files — into plain values,
// for the packages that turn them into options: gdist.InitFromEnv (a
// process group) and dist/fed (a federation). It is on the ground floor: it
// imports nothing of the project, and its errors say which variable is at
// fault and what it should be; callers wrap them with their own sentinel
// (dist.ErrEnv).
//
// # Usage
//
//	d, ok, err := envconf.Duration(os.LookupEnv, "GDIST_INIT_TIMEOUT")
//	if err != nil {
//		return fmt.Errorf("%w: %w", dist.ErrEnv, err) // GDIST_INIT_TIMEOUT="x" is not a positive duration (e.g. 10s)
//	}
package envconf

import (
	"fmt"
	"time"

	"github.com/gdist/gdist/internal/options"
)

// The variables this package reads by name.
const (
	HeartbeatTimeout  = "GDIST_HEARTBEAT_TIMEOUT"
	HeartbeatInterval = "GDIST_HEARTBEAT_INTERVAL"
	TLSCert           = "GDIST_TLS_CERT"        // this rank's certificate chain, PEM
	TLSKey            = "GDIST_TLS_KEY"         // its private key, PEM
	TLSCA             = "GDIST_TLS_CA"          // the CA certificates trusted for the peers, PEM
	TLSServerName     = "GDIST_TLS_SERVER_NAME" // the name every rank's certificate carries (optional)
)

// Error is a malformed variable.
type Error struct {
	Var    string // the variable
	Value  string // its value
	Reason string // what is wrong, in words
}

func (e *Error) Error() string { return fmt.Sprintf("%s=%q %s", e.Var, e.Value, e.Reason) }

// Lookup is os.LookupEnv's shape.
type Lookup func(string) (string, bool)

// Duration parses the positive duration in variable name, if set: ok is
// false when it is not set (or empty).
func Duration(lookup Lookup, name string) (time.Duration, bool, error) {
	return positive(lookup, name, time.ParseDuration, "a positive duration (e.g. 10s)")
}

// Size parses the positive byte count in variable name, if set: decimal
// bytes with an optional K, M or G suffix (binary: 64M is 64 MiB).
func Size(lookup Lookup, name string) (int, bool, error) {
	return positive(lookup, name, options.ParseBytes, "a positive size in bytes (e.g. 67108864 or 64M)")
}

func positive[T ~int | ~int64](lookup Lookup, name string, parse func(string) (T, error), want string) (x T, ok bool, err error) {
	v, set := lookup(name)
	if !set || v == "" {
		return 0, false, nil
	}
	x, err = parse(v)
	if err != nil || x <= 0 {
		return 0, false, &Error{Var: name, Value: v, Reason: "is not " + want}
	}
	return x, true, nil
}

// Heartbeat returns the heartbeat GDIST_HEARTBEAT_TIMEOUT and
// GDIST_HEARTBEAT_INTERVAL ask for: ok is false when neither is set;
// timeout is defTimeout when only the interval is set, and interval 0 (for
// the transport to derive) when only the timeout is. The timeout must be at
// least twice the interval.
func Heartbeat(lookup Lookup, defTimeout time.Duration) (interval, timeout time.Duration, ok bool, err error) {
	timeout, tset, err := Duration(lookup, HeartbeatTimeout)
	if err != nil {
		return 0, 0, false, err
	}
	interval, iset, err := Duration(lookup, HeartbeatInterval)
	if err != nil {
		return 0, 0, false, err
	}
	if !tset && !iset {
		return 0, 0, false, nil
	}
	if !tset {
		timeout = defTimeout
	}
	if iset && timeout < 2*interval {
		v, _ := lookup(HeartbeatTimeout)
		return 0, 0, false, &Error{Var: HeartbeatTimeout, Value: v,
			Reason: fmt.Sprintf("(%v) must be at least twice %s=%v", timeout, HeartbeatInterval, interval)}
	}
	return interval, timeout, true, nil
}

// TLSFiles are the PEM files GDIST_TLS_CERT, GDIST_TLS_KEY and GDIST_TLS_CA
// name, and GDIST_TLS_SERVER_NAME.
type TLSFiles struct {
	Cert, Key, CA, ServerName string
}

// TLS returns the TLS files the environment names: ok is false when none of
// GDIST_TLS_CERT, _KEY and _CA is set; setting some but not all of them is
// an error naming the first one missing.
func TLS(lookup Lookup) (TLSFiles, bool, error) {
	get := func(name string) string { v, _ := lookup(name); return v }
	f := TLSFiles{Cert: get(TLSCert), Key: get(TLSKey), CA: get(TLSCA), ServerName: get(TLSServerName)}
	if f.Cert == "" && f.Key == "" && f.CA == "" {
		if f.ServerName != "" {
			return TLSFiles{}, false, &Error{Var: TLSServerName, Value: f.ServerName,
				Reason: fmt.Sprintf("is set without %s, %s and %s", TLSCert, TLSKey, TLSCA)}
		}
		return TLSFiles{}, false, nil
	}
	for _, v := range []struct{ name, val string }{{TLSCert, f.Cert}, {TLSKey, f.Key}, {TLSCA, f.CA}} {
		if v.val == "" {
			return TLSFiles{}, false, &Error{Var: v.name, Value: "",
				Reason: fmt.Sprintf("is not set: TLS needs %s, %s and %s", TLSCert, TLSKey, TLSCA)}
		}
	}
	return f, true, nil
}
