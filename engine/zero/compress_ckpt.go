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
// when the checkpoint was written by as many data-parallel ranks. Written
// by another number, they are resharded (compress_reshard.go): every rank
// starts from the mean of the saved residuals, and int8's chunk-sum
// residuals are cut at the new chunks, which keeps what was not yet
// applied, once; the run's log says so. Without any (another kind, or no
// compression), they start from zero, also with a note. Q is the same on
// every rank and survives a change of dp; a change of rank restarts it.
const CompressPrefix = ckpt.OptimizerPrefix + "grad_compression."

func (z *compressor) kindName() string {
	if z.low != nil {
		return "powersgd"
	}
	return "int8"
}

func (z *compressor) residualName(dp, rank int) string {
	return fmt.Sprintf("%s%s.dp%d.rank%d.residual", CompressPrefix, z.kindName(), dp, rank)
}

func sumResidualName(dp, rank int) string {
	return fmt.Sprintf("%sint8.dp%d.rank%d.sum_residual", CompressPrefix, dp, rank)
}

func qName(param string) string { return CompressPrefix + "powersgd.q." + param }

// shard is what this rank saves of the compression state (views of it).
func (z *compressor) shard() []ckpt.Tensor {
	if z == nil {
		return nil
	}
	dp, rank := z.c.Size(), z.c.Rank()
	ts := []ckpt.Tensor{{Name: z.residualName(dp, rank), Shape: []int{len(z.resid)}, Data: z.resid}}
	if z.q8 != nil {
		ts = append(ts, ckpt.Tensor{Name: sumResidualName(dp, rank), Shape: []int{len(z.q8.resid)}, Data: z.q8.resid})
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
	z.note = ""
	var fresh []string
	read := func(name string, shape []int, dst []float32) (bool, error) { return loadFlat(c, name, shape, dst) }
	ok, err := z.loadResiduals(read)
	if err == nil && !ok {
		if from := z.savedDP(c.Manifest.Tensors); from > 0 && from != z.c.Size() {
			if ok, err = z.reshard(from, read); ok {
				z.note = fmt.Sprintf("grad_compression %s: resharded the error feedback of dp %d onto dp %d: every rank starts from the mean of the %d saved residuals", z.cfg, from, z.c.Size(), from)
			}
		}
	}
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
	if n := z.loadNote(c, fresh); n != "" && z.note != "" {
		z.note += "; " + n
	} else if n != "" {
		z.note = n
	}
	return nil
}

// stateReader reads the saved tensor name into dst if it is there with
// that shape (false if not).
type stateReader func(name string, shape []int, dst []float32) (bool, error)

// loadResiduals reads this rank's residuals saved at this dp, all or none
// (false, and zero, when one is missing).
func (z *compressor) loadResiduals(read stateReader) (bool, error) {
	dp, rank := z.c.Size(), z.c.Rank()
	names, dsts := []string{z.residualName(dp, rank)}, [][]float32{z.resid}
	if z.q8 != nil {
		names, dsts = append(names, sumResidualName(dp, rank)), append(dsts, z.q8.resid)
	}
	for i, name := range names {
		ok, err := read(name, []int{len(dsts[i])}, dsts[i])
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
