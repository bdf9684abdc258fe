// Package engine will hold everything that runs inside a rank of gtrain's
// built-in training engine: tensors and kernels, the model, the optimizer,
// collectives (engine/comm), ZeRO, pipelines, checkpoints and data. It
// arrives with issues 4-6; until then `gtrain run` runs user commands only.
package engine
