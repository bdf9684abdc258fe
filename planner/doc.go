// Package planner is the cost model and search behind `gtrain plan` and
// `gtrain run --auto`: given a transformer (Model), a cluster (Topology), a
// global batch and a precision, it enumerates 3D-parallel layouts — tensor
// (TP) × pipeline (PP) × data (DP) parallel degrees, ZeRO stage,
// micro-batch and activation recomputation — and predicts for each the
// memory per GPU on the most loaded rank, the communication on each link,
// the step time, TFLOP/s and MFU, rejecting what does not fit with the
// reason.
//
// The formulas come from the literature and are documented, with their
// sources and known errors, in docs/planner.md: model-state memory from the
// ZeRO paper (Rajbhandari et al. 2020), activation memory from Korthikanti
// et al. 2022, FLOPs and the pipeline bubble from Narayanan et al. 2021;
// compute time is matrix multiplies at a shape-dependent fraction of peak
// plus memory-bound kernels at a fraction of the memory bandwidth, checked
// against every row of that paper's Table 1.
// Every candidate is evaluated in closed form, so a search over thousands
// of layouts for a 1T-parameter model on 3072 GPUs takes milliseconds.
//
// Grid.Coord is the one mapping from a global rank to its (dp, pp, tp)
// coordinates, TP fastest; the engine uses the same function.
//
// The package is pure: no SSH, no NVML, no terminal styling, no network,
// and no I/O but the bounded reads of the topology file or hostfile a
// Request names (hostfiles.ReadFile). The command
// line (cmd/gtrain) binds flags into a Request, calls Plan, and renders.
package planner
