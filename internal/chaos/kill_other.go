//go:build !unix

package chaos

import "os"

// KillSelf ends the process at once (no SIGKILL here): no deferred calls.
func KillSelf() { os.Exit(137) }
