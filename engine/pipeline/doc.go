// Package pipeline is the built-in engine's pipeline parallelism: the
// split of a model's layers over stages, the schedules that order each
// stage's work on the micro-batches of one optimizer step, and Run, the
// driver that executes one rank's part of a schedule over the pipeline
// group's communicator.
//
// # Stages and chunks
//
// A pipeline of p ranks runs the model as p·v virtual stages, each a run
// of consecutive layers (Split). Rank r holds the v model chunks r, r+p,
// r+2p, …: with v = 1 (1F1B, GPipe) rank r is stage r; with v > 1
// (interleaved) the activations go round the ranks v times. Virtual stage
// 0 reads the data; the last one computes the loss.
//
// # Schedules
//
// For m micro-batches, each virtual stage runs the forward and then the
// backward of every micro-batch; a schedule is the order in which a rank
// runs its 2·m·v operations (Schedule.Ops). Counting a stage's forward and
// backward as t_f and t_b, every schedule here takes (m + (p−1)/v)·(t_f +
// t_b) when transfers are free: a bubble of (p−1)/(v·m) of the ideal time
// (Narayanan et al. 2021, section 2.2).
//
//   - GPipe (Huang et al. 2019): all m forwards, then all m backwards. The
//     reference: its bubble is 1F1B's, but every stage holds the
//     activations of all m micro-batches.
//   - 1F1B, PipeDream-Flush (Narayanan et al. 2021): stage r runs p−r−1
//     warm-up forwards, then alternates one forward and one backward, then
//     runs the remaining backwards (the cool-down). Stage r holds at most
//     min(p−r, m) micro-batches' activations: the first stage p, the last
//     one.
//   - Interleaved 1F1B (Megatron-LM's, same paper, section 2.2.2): v chunks
//     per rank, micro-batches taken in groups of p (m must be a multiple of
//     p), each group through chunk 0, then chunk 1, …; backwards in the
//     reverse chunk order. Rank r warms up with (p−r−1)·2 + (v−1)·p chunk
//     forwards. The bubble shrinks v-fold for v times as many transfers.
//
// Within one virtual stage every schedule runs the micro-batches in order,
// forwards and backwards alike, so parameter gradients accumulate in the
// same order whatever the schedule (and match a sequential run bit for
// bit).
//
// # Communication
//
// Each operation but the first virtual stage's forwards receives its input
// (an activation from the previous virtual stage, a gradient from the
// next), and each but the last stage's forwards and the first stage's
// backwards sends its output. On a link that does not buffer, two
// neighbours sending to each other at once wait for each other forever,
// and the communicator runs one operation at a time, in the order issued.
// So Schedule.Steps places every transfer in a communicator operation
// with a partner that makes the exchange symmetric, as Megatron-LM does:
//
//   - 1F1B and GPipe: between two operations, one SendRecv carries the
//     first one's output and the second one's input
//     (send_forward_recv_backward and send_backward_recv_forward in the
//     steady state); a lone Send or Recv where there is only one.
//   - Interleaved: after each steady-state forward-backward pair, first the
//     activations shift (output to the next rank, the next forward's input
//     from the previous one), then the gradients (the other way, the next
//     backward's gradient received one operation ahead); Megatron-LM
//     batches the two into one operation.
//
// The tests run every schedule on a model of the strictest link (comm's
// in-process transport) for deadlock, message order and makespan, and
// show that the unpaired order deadlocks.
//
// Run issues each transfer in the background, in step order, and waits
// for one only before the operation that uses what it receives: a send not
// paired with a receive (the first stage's warm-up, the last stage's
// cool-down) and the interleaved schedule's early gradient receives
// overlap compute.
package pipeline
