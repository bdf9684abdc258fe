package main

import (
	"testing"

	"github.com/gtrain/gtrain/internal/netns"
)

// TestRunAutoHostsIgnoresLauncherMemory: --auto with --hosts (a Slurm
// hostlist, no hostfile) plans from what the hosts' agents reported, as
// with --hostfile (TestRunAutoHostfileIgnoresLauncherMemory): a launcher
// in a memory cgroup of 128 MiB, in which no layout of the job fits, runs
// it on 2 hosts that have the memory. It used to refuse the job from its
// own memory before any host was asked.
func TestRunAutoHostsIgnoresLauncherMemory(t *testing.T) {
	autoIgnoresLauncherMemory(t, func(c *netns.Cluster) []string {
		return []string{"--hosts", c.Hosts[0].IP + "," + c.Hosts[1].IP, "--nproc-per-node", "1"}
	})
}
