// Command gtrain launches distributed training jobs: one rank per GPU slot on
// every host of a hostfile (or on this machine), with the torchrun environment
// contract, live status, and whole-job teardown on the first failure.
package main

import "os"

func main() {
	os.Exit(Main(os.Args[1:], Stdio()))
}
