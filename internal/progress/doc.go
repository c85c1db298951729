// Package progress holds the pieces the example programs use to show how
// training is going: a smoothed loss, a redrawing bar for terminals and a
// milestone counter for the sparse plain lines printed when stderr is a pipe
// (as under gdistrun) or a file, where thousands of '\r' redraws would be
// noise. Each program keeps its own line format.
//
// # Usage
//
//	var loss progress.EMA
//	if progress.IsTerminal(os.Stderr) {
//		bar := progress.NewBar(os.Stderr, steps*batch, "epoch 1/3", "samples")
//		// per step: bar.Describe(fmt.Sprintf("loss %.4f", loss.Add(l))); bar.Add(batch)
//		_ = bar.Finish()
//	} else {
//		m := progress.Milestones{Parts: 4} // a line at 25%, 50% and 75%
//		// per step:
//		if l := loss.Add(l); m.Due(step, steps) {
//			fmt.Fprintf(os.Stderr, "%d/%d loss %.4f\n", step, steps, l)
//		}
//	}
package progress
