// Package tensorpar holds the building blocks of Megatron-LM's tensor
// parallelism (Shoeybi et al. 2019) and sequence parallelism (Korthikanti
// et al. 2022) for the built-in engine: linear layers split by columns and
// by rows, a vocabulary-parallel token embedding and cross-entropy, and the
// map from a full (Hugging Face-layout) tensor to the part a TP rank owns.
// The layers compute with a backend.Backend (GEMMs through its Matmul) and
// communicate over the TP group's *comm.Communicator, wrapped in a Group.
//
// # Conventions
//
// Tensors are flat row-major float32, as everywhere in the engine; an
// activation is N×C with N = B·T token rows. Weights are in Hugging Face's
// Conv1D layout [in, out] (y = x·W + b) unless Linear.Transposed says
// [out, in], as for the tied token embedding used as the output layer.
// Parts follow engine/comm's block rule (Block): n items over p ranks give
// n/p to each and one more to the first n%p, so a split tensor is gathered
// by one AllGather. Backward methods accumulate (+=) into weight and bias
// gradients, as the model does over micro-batches, and write the input
// gradient.
//
// # The math
//
// A column-parallel layer Y = X·[W_0 … W_{p-1}] gives rank r the output
// features Y_r = X·W_r (+ b_r): no communication forward. Backward, dX =
// Σ_r dY_r·W_rᵀ is a sum of every rank's partial product: one all-reduce.
// A row-parallel layer splits W by rows and X by features, Y = Σ_r X_r·W_r:
// one all-reduce forward, the bias added once after it; backward, dX_r =
// dY·W_rᵀ needs no communication. A transformer block puts them in pairs,
// column then row (c_attn → attention over this rank's heads → attn.c_proj;
// c_fc → GELU → mlp.c_proj), so the elementwise work in between needs no
// communication and each pair costs one all-reduce forward and one
// backward.
//
// c_attn's columns are q|k|v, C each; a head is hs = C/NH consecutive
// columns of each. Splitting by heads takes rank r's columns [r·C/p,
// (r+1)·C/p) from each of q, k and v (not a contiguous third of the 3C
// columns) and stores them as q_r|k_r|v_r: exactly the qkv layout of NH/p
// heads of width C/p that the attention kernel reads (Split QKVHeads).
//
// Sequence parallelism shards the activations outside those pairs (the
// residual stream, LayerNorm, the embedding's output) by token rows: rank r
// holds rows SequenceRows(N) (B·T must divide by p). The all-reduce of a
// pair becomes an all-gather of the input before the column-parallel layer
// (its backward: a reduce-scatter of the input gradient) and a
// reduce-scatter of the output after the row-parallel layer (its backward:
// an all-gather of the output gradient): the same bytes on the wire, and
// the LayerNorm and residual activations stored 1/p each. The layers gather
// again in backward rather than keep the full input, which is what saves
// the memory. A replicated parameter used on row shards (LayerNorm) gets a
// partial gradient on each rank, summed by ReduceReplicated; this package's
// own replicated parameters (a row-parallel bias, the position embedding)
// are differentiated from gathered rows and need no such sum.
//
// The token embedding splits the vocabulary (Rows of wte): each rank looks
// up the tokens in its range and writes zeros for the others, and the sum
// over the group (all-reduce; reduce-scatter with sequence parallelism) is
// every token's row, exactly. The output layer is the same shard used as a
// column-parallel layer with a transposed weight, giving each rank its
// vocabulary range of the logits, and the cross-entropy works on those
// shards without gathering them: per token, an all-reduce of the maxima,
// then one all-reduce of the sums of exponentials and of the target's
// logit (Megatron's vocab_parallel_cross_entropy, with its last two
// all-reduces fused); the backward needs none.
package tensorpar
