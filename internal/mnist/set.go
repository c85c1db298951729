package mnist

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/gdist/gdist/internal/errs"
)

// Classes is the number of MNIST classes (the digits 0 to 9).
const Classes = 10

// ErrInvalidArgument is matched by the error of a bad argument to Batch.
// It is the value every gdist package exports under this name
// (errs.ErrInvalidArgument).
var ErrInvalidArgument = errs.ErrInvalidArgument

// Set is a labelled image set held in memory.
type Set struct {
	// Images holds N images of Rows x Cols pixels, row-major, one after
	// another, scaled from 0..255 to [0, 1].
	Images []float32
	// Labels holds N labels, each in [0, Classes).
	Labels []uint8
	// N is the number of images; Rows and Cols are the image height and width.
	N, Rows, Cols int
}

// Pixels returns the number of pixels in one image (Rows * Cols).
func (s *Set) Pixels() int { return s.Rows * s.Cols }

// Image returns image i as a sub-slice of s.Images (not a copy: it aliases
// the set's storage).
func (s *Set) Image(i int) []float32 {
	p := s.Pixels()
	return s.Images[i*p : (i+1)*p : (i+1)*p]
}

// scale maps a pixel byte to [0, 1].
var scale = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(i) / 255
	}
	return t
}()

// NewSet builds a Set from an images IDX (magic MagicImages: count, rows,
// columns) and a labels IDX (magic MagicLabels: count). It checks that the
// counts agree and that every label is below Classes. The Set owns new
// storage; images and labels are not retained.
func NewSet(images, labels *IDX) (*Set, error) {
	if m := images.Magic(); m != MagicImages {
		return nil, fmt.Errorf("%w: images have magic number %#08x, want %#08x", ErrFormat, m, MagicImages)
	}
	if m := labels.Magic(); m != MagicLabels {
		return nil, fmt.Errorf("%w: labels have magic number %#08x, want %#08x", ErrFormat, m, MagicLabels)
	}
	n, rows, cols := images.Dims[0], images.Dims[1], images.Dims[2]
	if labels.Dims[0] != n {
		return nil, fmt.Errorf("%w: %d images but %d labels", ErrFormat, n, labels.Dims[0])
	}
	if len(images.Data) != n*rows*cols || len(labels.Data) != n {
		return nil, fmt.Errorf("%w: data lengths %d and %d do not match dimensions %v and %v",
			ErrFormat, len(images.Data), len(labels.Data), images.Dims, labels.Dims)
	}
	for i, l := range labels.Data {
		if l >= Classes {
			return nil, fmt.Errorf("%w: label %d at index %d is not below %d", ErrFormat, l, i, Classes)
		}
	}
	s := &Set{
		Images: make([]float32, len(images.Data)),
		Labels: append([]uint8(nil), labels.Data...),
		N:      n,
		Rows:   rows,
		Cols:   cols,
	}
	for i, b := range images.Data {
		s.Images[i] = scale[b]
	}
	return s, nil
}

// The IDX files of the standard MNIST distribution. Each may be stored
// gzip-compressed (with a ".gz" suffix, preferred) or plain.
const (
	TrainImagesFile = "train-images-idx3-ubyte"
	TrainLabelsFile = "train-labels-idx1-ubyte"
	TestImagesFile  = "t10k-images-idx3-ubyte"
	TestLabelsFile  = "t10k-labels-idx1-ubyte"
)

var dataFiles = [4]string{TrainImagesFile, TrainLabelsFile, TestImagesFile, TestLabelsFile}

// Load finds the MNIST directory with Locate(dir) and reads its four IDX
// files (in parallel), returning the 60 000-image training set and the
// 10 000-image test set. The caller owns both sets. Errors satisfy
// errors.Is(err, ErrNotFound) when no directory holds the files and
// errors.Is(err, ErrFormat) when a file is malformed.
func Load(dir string) (train, test *Set, err error) {
	if dir, err = Locate(dir); err != nil {
		return nil, nil, err
	}
	var (
		idx  [4]*IDX
		errs [4]error
		wg   sync.WaitGroup
	)
	for i, name := range dataFiles {
		wg.Go(func() {
			idx[i], errs[i] = readFile(dir, name)
		})
	}
	wg.Wait()
	if err := errors.Join(errs[:]...); err != nil {
		return nil, nil, err
	}
	if train, err = NewSet(idx[0], idx[1]); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	if test, err = NewSet(idx[2], idx[3]); err != nil {
		return nil, nil, fmt.Errorf("%s: %w", dir, err)
	}
	return train, test, nil
}

// readFile reads dir/name.gz, or dir/name if there is no compressed copy.
func readFile(dir, name string) (*IDX, error) {
	path, err := findFile(dir, name)
	if err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("mnist: %w", err)
	}
	defer f.Close()
	x, err := ReadIDX(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return x, nil
}

// findFile returns the path of dir/name.gz or dir/name, whichever exists
// first, or an error naming both.
func findFile(dir, name string) (string, error) {
	base := filepath.Join(dir, name)
	for _, p := range [2]string{base + ".gz", base} {
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("mnist: neither %s.gz nor %s exists", base, base)
}
