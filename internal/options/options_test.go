package options

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var errInvalid = errors.New("test: invalid argument")

type config struct{ n []int }

type option func(*config) error

func set(n int) option {
	return func(c *config) error {
		if n < 0 {
			return fmt.Errorf("%w: set(%d)", errInvalid, n)
		}
		c.n = append(c.n, n)
		return nil
	}
}

func TestApply(t *testing.T) {
	var c config
	require.NoError(t, Apply(&c, []option{set(1), set(2)}, "test", errInvalid))
	assert.Equal(t, []int{1, 2}, c.n, "in order")

	c = config{}
	err := Apply(&c, []option{set(1), set(-1), set(-2)}, "test", errInvalid)
	require.ErrorIs(t, err, errInvalid)
	assert.ErrorContains(t, err, "set(-1)", "the first refusal")
	assert.Equal(t, []int{1}, c.n, "stops there")

	err = Apply(&c, []option{set(3), nil}, "test", errInvalid)
	require.ErrorIs(t, err, errInvalid)
	assert.EqualError(t, err, "test: option 1 is nil: test: invalid argument")

	require.NoError(t, Apply[config, option](&c, nil, "test", errInvalid))
}

func TestNoNil(t *testing.T) {
	require.NoError(t, NoNil("test: WithAll", []option{set(1), set(-1)}, errInvalid), "values are not checked")
	require.NoError(t, NoNil[config, option]("test: WithAll", nil, errInvalid))
	err := NoNil("test: WithAll", []option{set(1), nil}, errInvalid)
	require.ErrorIs(t, err, errInvalid)
	assert.EqualError(t, err, "test: WithAll: option 1 is nil: test: invalid argument")
}

func TestParseBytes(t *testing.T) {
	for s, want := range map[string]int{"0": 0, "8": 8, "64K": 64 << 10, "2KiB": 2 << 10, "16M": 16 << 20, "3MiB": 3 << 20, "1G": 1 << 30, "1GiB": 1 << 30} {
		got, err := ParseBytes(s)
		require.NoError(t, err, s)
		assert.Equal(t, want, got, s)
	}
	for _, s := range []string{"", "K", "-1", "1T", "1.5M", "x", "99999999999999999G"} {
		_, err := ParseBytes(s)
		assert.Error(t, err, s)
	}
}
