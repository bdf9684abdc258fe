package optim

// The dense, whole-vector forms of the update and of clipping, which the
// tests compare with PyTorch; the engine updates parts (UpdateParts) with
// the clip folded into the gradient factor (ClipScale).

// Update applies one AdamW step with learning rate lr to params from grads,
// in torch.optim.AdamW's order: decay the weights, update the moments, step
// by the bias-corrected ratio.
func (o *AdamW) Update(params, grads []float32, lr float64) {
	parts := make([]Part, len(o.groups))
	for i, g := range o.groups {
		parts[i] = Part{P: params[g.Offset : g.Offset+g.Size], G: grads[g.Offset : g.Offset+g.Size], At: g.Offset, Decay: g.Decay}
	}
	o.UpdateParts(parts, lr, 1)
}

// Clip scales grads so that their global norm is at most max and reports
// the scale applied, as torch.nn.utils.clip_grad_norm_ does.
func Clip(grads []float32, norm, max float64) float64 {
	scale := ClipScale(norm, max)
	if scale == 1 {
		return 1
	}
	s := float32(scale)
	for i := range grads {
		grads[i] *= s
	}
	return scale
}
