// Package planner will hold the cost model and search behind `gtrain plan`,
// and the Topology value that describes a cluster. It is pure: no SSH, no
// NVML, no I/O. It arrives with issue 7; until then `gtrain plan` exits 2.
package planner
