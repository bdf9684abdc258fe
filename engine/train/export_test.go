package train

import "context"

// New is NewContext with a context that never ends, for tests that do not
// interrupt the trainer.
func New(spec Spec, env Env) (*Trainer, error) {
	return NewContext(context.Background(), spec, env)
}
