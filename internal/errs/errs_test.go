package errs

import (
	"errors"
	"fmt"
	"testing"
)

func TestNarrow(t *testing.T) {
	parent := errors.New("parent")
	e := Narrow("x: narrow", parent)
	if e.Error() != "x: narrow" {
		t.Errorf("Error() = %q", e.Error())
	}
	wrapped := fmt.Errorf("op: %w", e)
	if !errors.Is(wrapped, e) || !errors.Is(wrapped, parent) {
		t.Errorf("%v does not match both sentinels", wrapped)
	}
	if errors.Is(parent, e) || errors.Is(ErrInvalidArgument, parent) {
		t.Error("the parent matches the narrower sentinel")
	}
}
