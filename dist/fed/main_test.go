package fed_test

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// mainTests runs the package's tests with a goroutine-leak check.
func mainTests(m *testing.M) {
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			os.Stderr.WriteString("goleak: " + err.Error() + "\n")
			code = 1
		}
	}
	os.Exit(code)
}
