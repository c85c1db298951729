package ctxseen_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/gdist/gdist/internal/ctxseen"
)

func TestSeen(t *testing.T) {
	parent, cancel := context.WithCancel(context.Background())
	ctx := ctxseen.New(parent)
	assert.NoError(t, ctx.Err())
	assert.False(t, ctx.Seen())
	cancel()
	assert.False(t, ctx.Seen(), "ended, but nobody looked")
	<-ctx.Done()
	assert.ErrorIs(t, ctx.Err(), context.Canceled)
	assert.True(t, ctx.Seen())
}
