package comm

import (
	"fmt"
	"regexp"
	"syscall"
)

// The links' congestion control. gtrain's links set their own
// (TCP_CONGESTION, per socket; nothing system-wide changes): reno, unless
// TCPConfig.Congestion (GTRAIN_COMM_TCP_CC) says otherwise. A collective's
// traffic is bursts, each as fast as the sender can go, separated by
// compute: on such a link a pacing congestion control (BBR, the default of
// some distributions and of this machine) never samples the link's real
// rate, since a burst is application-limited, and paces every burst at the
// low rate it did sample. Measured over two network-namespace hosts (veth,
// MTU 1500, 2026-11-26, docs/benchmarks.md): a 512 KiB exchange each way
// took 294 µs under BBR (ss -i: pacing_rate 14 Gbit/s, spurious fast
// retransmits from reordering), 274 µs under CUBIC, 77 µs under reno; in
// gtrain's 2-host collectives reno made 512 KiB-4 MiB 1.1-3.5x faster than
// BBR (two interleaved runs). CUBIC grows its window by wall-clock time since the last loss,
// which at a data centre's µs round trips is far slower than reno's one
// segment per round trip. reno is built into every Linux kernel and
// always allowed to unprivileged processes.

// tcpCongestionName is what a kernel accepts as a congestion control
// name (TCP_CA_NAME_MAX is 16 bytes with the NUL).
var tcpCongestionName = regexp.MustCompile(`^[a-z0-9_-]{1,15}$`)

// tcpCongestion checks TCPConfig.Congestion and returns what the links
// set: the default when it is empty, the system's when the default cannot
// be set here, and an error when a name asked for cannot.
func tcpCongestion(name string) (string, error) {
	switch {
	case name == TCPCongestionSystem:
		return name, nil
	case name == "":
		if tcpProbeCongestion(DefaultTCPCongestion) != nil {
			return TCPCongestionSystem, nil
		}
		return DefaultTCPCongestion, nil
	case !tcpCongestionName.MatchString(name):
		return "", fmt.Errorf("congestion control %.40q: want a name such as reno or cubic (lower case, at most 15 characters), or %q", name, TCPCongestionSystem)
	}
	if err := tcpProbeCongestion(name); err != nil {
		return "", fmt.Errorf("congestion control %q: the kernel refused it (%v): pick one of net.ipv4.tcp_allowed_congestion_control, or %q", name, err, TCPCongestionSystem)
	}
	return name, nil
}

// CheckTCPCongestion reports whether name would do as
// TCPConfig.Congestion on this host ("" and TCPCongestionSystem always do).
func CheckTCPCongestion(name string) error {
	_, err := tcpCongestion(name)
	return err
}

// tcpProbeCongestion sets name on a socket of its own.
func tcpProbeCongestion(name string) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer syscall.Close(fd)
	return setTCPCongestion(fd, name)
}
