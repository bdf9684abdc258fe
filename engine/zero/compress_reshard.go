package zero

import (
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
)

// Resharding the residuals onto another dp. Error feedback keeps an
// invariant: the updates applied so far plus the ranks' mean residual (plus
// int8's chunk-sum residuals) are the sum of the true mean gradients. With
// every new rank starting from the mean of the saved residuals, the new
// ranks' mean is the old one; the chunk-sum residuals, one value per
// element of the flat layout over all ranks, are reassembled and cut at
// the new ranks' chunks. Nothing not yet applied is lost or counted twice.

// savedDP is the dp whose residuals of this kind tensors (a checkpoint's
// sorted index) holds, 0 if none.
func (z *compressor) savedDP(tensors []ckpt.TensorIndex) int {
	pre := CompressPrefix + z.kindName() + ".dp"
	for _, t := range tensors {
		rest, ok := strings.CutPrefix(t.Name, pre)
		if !ok {
			continue
		}
		if d, ok := strings.CutSuffix(rest, ".rank0.residual"); ok {
			if dp, err := strconv.Atoi(d); err == nil && dp > 0 && dp <= maxSavedDP {
				return dp
			}
		}
	}
	return 0
}

// maxSavedDP bounds the saved ranks read back: a checkpoint's names are
// data, and each rank read is a full-size tensor.
const maxSavedDP = 1 << 20

// reshard sets this rank's residuals from the from ranks' saved ones;
// false (and zero) when one of them is missing.
func (z *compressor) reshard(from int, read stateReader) (bool, error) {
	clear(z.resid)
	tmp := make([]float32, len(z.resid))
	for r := range from {
		if ok, err := read(z.residualName(from, r), []int{len(tmp)}, tmp); err != nil || !ok {
			clear(z.resid)
			return false, err
		}
		for i, v := range tmp {
			z.resid[i] += v
		}
	}
	inv := 1 / float32(from)
	for i := range z.resid {
		z.resid[i] *= inv
	}
	if z.q8 == nil {
		return true, nil
	}
	ok, err := z.reshardSums(from, read, tmp)
	if err != nil || !ok {
		clear(z.resid)
	}
	return ok, err
}

// reshardSums assembles the from ranks' chunk-sum residuals in the flat
// layout (into full) and takes this rank's chunks of it.
func (z *compressor) reshardSums(from int, read stateReader, full []float32) (bool, error) {
	clear(full)
	for r := range from {
		n := 0
		for _, s := range z.segs {
			lo, hi := comm.Block(s.Size, r, from)
			n += hi - lo
		}
		saved := make([]float32, n)
		if ok, err := read(sumResidualName(from, r), []int{n}, saved); err != nil || !ok {
			return false, err
		}
		at := 0
		for _, s := range z.segs {
			lo, hi := comm.Block(s.Size, r, from)
			at += copy(full[s.Offset+lo:s.Offset+hi], saved[at:])
		}
	}
	for i, s := range z.segs {
		lo, hi := comm.Block(s.Size, z.q8.rank, z.q8.ranks)
		copy(z.q8.resid[z.q8.at[i]:], full[s.Offset+lo:s.Offset+hi])
	}
	return true, nil
}
