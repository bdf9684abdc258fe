package model

// ParamList describes the parameters: names, shapes and offsets into Params.
func (m *Model) ParamList() []Param { return m.params }

// ZeroGrad clears a dense model's gradients before a step's first
// micro-batch (other stores clear their own).
func (m *Model) ZeroGrad() { clear(m.Grads) }
