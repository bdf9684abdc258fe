//go:build !race

package optim

// raceEnabled reports a -race build, which runs the Go update loop.
const raceEnabled = false
