package zero

import (
	"fmt"
	"slices"
	"strings"

	"github.com/gtrain/gtrain/engine/ckpt"
)

// CompressPrefix starts the names of the gradient-compression state a
// checkpoint holds: optimizer state, so that an export of the model leaves
// it out.
//
//	optimizer.grad_compression.KIND.dpD.rankR.residual      rank R's error feedback, the flat layout
//	optimizer.grad_compression.int8.dpD.rankR.sum_residual  its residual of the chunk sums it re-quantised
//	optimizer.grad_compression.powersgd.q.PARAM             PowerSGD's warm-start Q (m×r), from rank 0
//
// Residuals are per rank, as PyTorch's hook state is: they are restored
// when the checkpoint was written by as many data-parallel ranks, and
// otherwise start from zero, with a note in the run's log. Q is the same
// on every rank and survives a change of dp; a change of rank restarts it.
const CompressPrefix = ckpt.OptimizerPrefix + "grad_compression."

func (z *compressor) kindName() string {
	if z.low != nil {
		return "powersgd"
	}
	return "int8"
}

func (z *compressor) residualName(rank int) string {
	return fmt.Sprintf("%s%s.dp%d.rank%d.residual", CompressPrefix, z.kindName(), z.c.Size(), rank)
}

func (z *compressor) sumResidualName(rank int) string {
	return fmt.Sprintf("%sint8.dp%d.rank%d.sum_residual", CompressPrefix, z.c.Size(), rank)
}

func qName(param string) string { return CompressPrefix + "powersgd.q." + param }

// shard is what this rank saves of the compression state (views of it).
func (z *compressor) shard() []ckpt.Tensor {
	if z == nil {
		return nil
	}
	rank := z.c.Rank()
	ts := []ckpt.Tensor{{Name: z.residualName(rank), Shape: []int{len(z.resid)}, Data: z.resid}}
	if z.q8 != nil {
		ts = append(ts, ckpt.Tensor{Name: z.sumResidualName(rank), Shape: []int{len(z.q8.resid)}, Data: z.q8.resid})
	}
	if z.low != nil && rank == 0 {
		for _, mt := range z.low.mats {
			ts = append(ts, ckpt.Tensor{Name: qName(mt.param.Name), Shape: []int{mt.m, mt.r}, Data: mt.q})
		}
	}
	return ts
}

// load restores the compression state from c where c holds it for this
// layout, and says in z.note what started afresh.
func (z *compressor) load(c *ckpt.Checkpoint) error {
	if z == nil {
		return nil
	}
	z.reset()
	var fresh []string
	ok, err := z.loadResiduals(c)
	if err != nil {
		return err
	}
	if !ok {
		fresh = append(fresh, "its error feedback starts from zero")
	}
	if z.low != nil {
		for i := range z.low.mats {
			mt := &z.low.mats[i]
			if ok, err = loadFlat(c, qName(mt.param.Name), []int{mt.m, mt.r}, mt.q); err != nil {
				return err
			}
			if !ok {
				fresh = append(fresh, "PowerSGD's warm-start Q is drawn afresh")
				z.low.initQ()
				break
			}
		}
	}
	z.note = z.loadNote(c, fresh)
	return nil
}

// loadResiduals reads this rank's residuals, all or none (false, and
// zero, when c lacks one of them).
func (z *compressor) loadResiduals(c *ckpt.Checkpoint) (bool, error) {
	rank := z.c.Rank()
	names, dsts := []string{z.residualName(rank)}, [][]float32{z.resid}
	if z.q8 != nil {
		names, dsts = append(names, z.sumResidualName(rank)), append(dsts, z.q8.resid)
	}
	for i, name := range names {
		ok, err := loadFlat(c, name, []int{len(dsts[i])}, dsts[i])
		if err != nil || !ok {
			for _, d := range dsts {
				clear(d)
			}
			return false, err
		}
	}
	return true, nil
}

// loadFlat reads tensor name of shape into dst if c holds it with that
// shape (false if not).
func loadFlat(c *ckpt.Checkpoint, name string, shape []int, dst []float32) (bool, error) {
	i, ok := slices.BinarySearchFunc(c.Manifest.Tensors, name, func(t ckpt.TensorIndex, n string) int {
		return strings.Compare(t.Name, n)
	})
	if !ok || !slices.Equal(c.Manifest.Tensors[i].Shape, shape) {
		return false, nil
	}
	v, _, err := c.Tensor(name)
	if err != nil {
		return false, fmt.Errorf("zero: load %s: %w", c.Dir, err)
	}
	copy(dst, v)
	return true, nil
}

// loadNote says what of the compression state started afresh, and why.
func (z *compressor) loadNote(c *ckpt.Checkpoint, fresh []string) string {
	if len(fresh) == 0 {
		return ""
	}
	why := fmt.Sprintf("the checkpoint holds none for %s at dp %d", z.cfg, z.c.Size())
	if i, ok := slices.BinarySearchFunc(c.Manifest.Tensors, CompressPrefix, func(t ckpt.TensorIndex, n string) int {
		if strings.HasPrefix(t.Name, n) {
			return 0
		}
		return strings.Compare(t.Name, n)
	}); ok {
		why += fmt.Sprintf(" (it holds %s: written with another dp, compression or PowerSGD rank)", c.Manifest.Tensors[i].Name)
	}
	return fmt.Sprintf("grad_compression %s: %s: %s", z.cfg, strings.Join(fresh, " and "), why)
}

// CompressionNote is what the last Load restored of the gradient
// compression state, when not all of it: for the run's log. Empty when
// nothing was lost (or nothing is compressed).
func (e *Engine) CompressionNote() string {
	if e.cz == nil {
		return ""
	}
	return e.cz.note
}
