package chaos

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestStep(t *testing.T) {
	t.Setenv(Env, "1:40:0,0:7:1,1:90:1,bad,2:x:0")
	t.Setenv("GDIST_RESTART_COUNT", "")
	assert.Equal(t, int64(40), Step(1))
	assert.Equal(t, int64(-1), Step(0))
	assert.Equal(t, int64(-1), Step(2), "a malformed step is ignored")
	t.Setenv("GDIST_RESTART_COUNT", "1")
	assert.Equal(t, int64(90), Step(1))
	assert.Equal(t, int64(7), Step(0))
	t.Setenv(Env, "")
	assert.Equal(t, int64(-1), Step(1))
}
