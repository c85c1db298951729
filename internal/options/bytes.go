package options

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ParseBytes parses a byte count with an optional binary suffix: K, M or
// G, also spelled KiB, MiB and GiB ("64M" is 64<<20). It refuses negative
// counts and counts that overflow an int; whether 0 is allowed is the
// caller's to say.
func ParseBytes(s string) (int, error) {
	mult := 1
	for _, u := range []struct {
		suffix string
		mult   int
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"K", 1 << 10}, {"M", 1 << 20}, {"G", 1 << 30}} {
		if t, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = t, u.mult
			break
		}
	}
	n, err := strconv.Atoi(s)
	switch {
	case err != nil:
		return 0, err
	case n < 0:
		return 0, errors.New("negative")
	case n > math.MaxInt/mult:
		return 0, fmt.Errorf("%d * %d overflows", n, mult)
	}
	return n * mult, nil
}
