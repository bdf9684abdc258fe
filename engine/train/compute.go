package train

import (
	"github.com/gtrain/gtrain/engine/backend"
	"github.com/gtrain/gtrain/engine/comm"
)

// cpuBackend is the backend a rank computes with: spec.threads(env)
// goroutines per operation and, with precision bf16, the matmuls on
// bfloat16 operands with float32 sums (backend.CPU.MatmulBF16), as
// mixed-precision training runs them; the rest of the step is float32,
// as before. fp16 keeps float32 matmuls: float16's range needs the loss
// scale, which is not applied inside the model, and no CPU kernel here
// multiplies float16 any faster.
func (s Spec) cpuBackend(env Env) backend.CPU {
	p, _ := comm.ParseDType(s.Precision)
	return backend.CPU{Threads: s.threads(env), MatmulBF16: p == comm.BFloat16}
}
