package mnist

import "fmt"

// Batch copies the images set.Image(idx[0]), set.Image(idx[1]), ... one
// after another into dstX, and their labels as one-hot rows of Classes
// values into dstY, so that dstX and dstY can back (len(idx), Pixels) and
// (len(idx), Classes) tensors. len(dstX) must be len(idx)*set.Pixels() and
// len(dstY) must be len(idx)*Classes. Batch allocates nothing and keeps
// no reference to the caller's slices. A length mismatch or an index
// outside [0, set.N) gives an error matching ErrInvalidArgument and leaves
// dstX and dstY unchanged.
func Batch[T float32 | float64](set *Set, idx []int, dstX, dstY []T) error {
	p := set.Pixels()
	if len(dstX) != len(idx)*p || len(dstY) != len(idx)*Classes {
		return fmt.Errorf("mnist: %w: batch of %d needs %d image and %d label values, got %d and %d",
			ErrInvalidArgument, len(idx), len(idx)*p, len(idx)*Classes, len(dstX), len(dstY))
	}
	for _, i := range idx {
		if i < 0 || i >= set.N {
			return fmt.Errorf("mnist: %w: index %d outside [0, %d)", ErrInvalidArgument, i, set.N)
		}
	}
	switch x := any(dstX).(type) {
	case []float32:
		for j, i := range idx {
			copy(x[j*p:(j+1)*p], set.Images[i*p:(i+1)*p])
		}
	default:
		for j, i := range idx {
			dst, src := dstX[j*p:(j+1)*p], set.Images[i*p:(i+1)*p]
			for k, v := range src {
				dst[k] = T(v)
			}
		}
	}
	clear(dstY)
	for j, i := range idx {
		dstY[j*Classes+int(set.Labels[i])] = 1
	}
	return nil
}
