package pipeline

import (
	"errors"
	"fmt"

	"gorgonia.org/gorgonia"
	"gorgonia.org/tensor"

	"github.com/gdist/gdist/internal/errs"
)

// Stage is one pipeline stage's part of a model: a contiguous range of
// layers whose learnables live in one Gorgonia graph. The pipeline calls
// Forward once per graph it builds, on an input node of InputShape, and
// expects a node of OutputShape back; both shapes include the micro-batch
// dimension, so a stage is built for one micro-batch size.
//
// *transformer.Stage (models/transformer) satisfies Stage as it is; a stage
// without learnables (or whose input dtype differs from its learnables')
// also implements Dtyper.
type Stage interface {
	// InputShape is the shape of one micro-batch's input.
	InputShape() tensor.Shape
	// OutputShape is the shape of one micro-batch's output.
	OutputShape() tensor.Shape
	// Forward adds the stage's computation to its graph and returns its
	// output node.
	Forward(in *gorgonia.Node) (*gorgonia.Node, error)
	// Learnables returns the stage's parameter nodes, in an order that is
	// the same for every graph the Builder makes. The caller owns the slice.
	Learnables() gorgonia.Nodes
}

// Dtyper is implemented by stages that declare their input dtype. Without
// it the input dtype is that of the stage's first learnable.
type Dtyper interface {
	Dtype() tensor.Dtype
}

// Builder adds a new instance of this rank's stage (learnables included) to
// g and returns it. The pipeline calls it once per graph it needs (see New);
// every call must build the same layers with the same shapes. Values of the
// learnables need not match between calls: the pipeline makes every graph
// share the first instance's parameter tensors.
type Builder func(g *gorgonia.ExprGraph) (Stage, error)

// LossFunc builds the last stage's loss from its output node and a target
// node of the target shape (the output shape unless WithTargetShape says
// otherwise). It must return a scalar node. transformer.CrossEntropy is a
// LossFunc.
type LossFunc func(out, target *gorgonia.Node) (*gorgonia.Node, error)

// Desc describes what flows between two stages for one micro-batch: a tensor
// shape and dtype.
type Desc struct {
	Shape tensor.Shape
	Dtype tensor.Dtype
}

// String formats d as "[8 64] float32".
func (d Desc) String() string {
	return fmt.Sprintf("%v %v", []int(d.Shape), d.Dtype)
}

// Equal reports whether d and o have the same shape and dtype.
func (d Desc) Equal(o Desc) bool { return d.Shape.Eq(o.Shape) && d.Dtype == o.Dtype }

// Errors of package pipeline. Match them with errors.Is.
var (
	// ErrInvalidArgument is wrapped by errors about bad options or
	// arguments. It is the value every gdist package exports under this
	// name (errs.ErrInvalidArgument).
	ErrInvalidArgument = errs.ErrInvalidArgument
	// ErrStage means a Stage or Builder broke its contract (Forward returned
	// another shape than OutputShape, the builds disagree, an unsupported
	// dtype).
	ErrStage = errors.New("pipeline: stage contract violated")
	// ErrConfigMismatch means the stages were set up with different
	// settings (number of stages, micro-batches, schedule). The message
	// names both stages.
	ErrConfigMismatch = errors.New("pipeline: stages disagree")
	// ErrCallMismatch means neighbouring stages are not in the same call:
	// one called Infer and the other TrainStep, or one made more calls than
	// the other. The stage that finds it names both calls; every other
	// stage fails with a *dist.PeerError wrapping it.
	ErrCallMismatch = errors.New("pipeline: stages are in different calls")
	// ErrNoLoss means TrainStep was called on the last stage of a pipeline
	// built without WithLoss.
	ErrNoLoss = errors.New("pipeline: no loss function (WithLoss) on the last stage")
	// ErrStageFailed is the Err of the *dist.PeerError a stage returns when
	// another stage failed for a reason of its own (an error in a callback,
	// a cancelled context, ...). A lost peer is reported with
	// dist.ErrPeerLost instead.
	ErrStageFailed = errors.New("pipeline: another stage failed")
	// ErrClosed is returned by every call after Close.
	ErrClosed = errors.New("pipeline: closed")
	// ErrBusy is returned when a call starts while another one runs: a
	// Pipeline is not safe for concurrent use.
	ErrBusy = errors.New("pipeline: concurrent call")
	// ErrBroken wraps the first failure in the errors of calls made after
	// the pipeline failed: a failed schedule cannot be resumed.
	ErrBroken = errors.New("pipeline: broken by an earlier failure")
)

// StageMismatchError reports that two neighbouring stages disagree about
// the tensor between them: stage Stage (on rank Rank) produces Output but
// stage Stage+1 (on rank NextRank) expects Input. Every stage of the
// pipeline returns the same error from New.
type StageMismatchError struct {
	Stage, Rank int
	NextRank    int
	Output      Desc // what stage Stage produces
	Input       Desc // what stage Stage+1 expects
}

func (e *StageMismatchError) Error() string {
	return fmt.Sprintf("pipeline: stage %d (rank %d) outputs %v but stage %d (rank %d) expects %v",
		e.Stage, e.Rank, e.Output, e.Stage+1, e.NextRank, e.Input)
}
