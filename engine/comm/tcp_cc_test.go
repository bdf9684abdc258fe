package comm

import (
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// tcpLinkCongestion is the congestion control of a single-stream link's
// socket, as the kernel reports it.
func tcpLinkCongestion(t *testing.T, cn Conn) string {
	t.Helper()
	c, ok := cn.(*tcpConn)
	if !ok || c.sock < 0 {
		t.Fatalf("link %T is not a TCP link on a descriptor of its own", cn)
	}
	name, err := unix.GetsockoptString(c.sock, unix.IPPROTO_TCP, unix.TCP_CONGESTION)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimRight(name, "\x00")
}

// TestTCPLinksSetCongestion checks that both ends of every link run the
// congestion control asked for: reno by default, the system's for
// "system", and another available one when named.
func TestTCPLinksSetCongestion(t *testing.T) {
	sys := strings.TrimSpace(readProc(t, "/proc/sys/net/ipv4/tcp_congestion_control"))
	other := ""
	for _, n := range strings.Fields(readProc(t, "/proc/sys/net/ipv4/tcp_available_congestion_control")) {
		if n != DefaultTCPCongestion && n != sys && CheckTCPCongestion(n) == nil {
			other = n
		}
	}
	cases := []struct{ ask, want string }{{"", DefaultTCPCongestion}, {TCPCongestionSystem, sys}, {DefaultTCPCongestion, DefaultTCPCongestion}}
	if other != "" {
		cases = append(cases, struct{ ask, want string }{other, other})
	} else {
		t.Logf("no congestion control other than %s and the system's (%s) may be set here: that case is left out", DefaultTCPCongestion, sys)
	}
	for _, tc := range cases {
		t.Run("ask="+tc.ask, func(t *testing.T) {
			store := NewMemStore()
			const n = 3
			_, links := tpMesh(t, n, func(rank int) (Transport, error) {
				return NewTCP(t.Context(), TCPConfig{Rank: rank, Size: n, Store: store, Secret: tpSecret, Prefix: "job/0/tcp",
					Bind: "127.0.0.1:0", Advertise: "127.0.0.1", Congestion: tc.ask})
			})
			for r := range n {
				for p := range n {
					if p == r {
						continue
					}
					if got := tcpLinkCongestion(t, links[r][p]); got != tc.want {
						t.Errorf("rank %d's link to %d runs %q, want %q", r, p, got, tc.want)
					}
				}
			}
			tpExchange(t, links, []int{1, 300 << 10})
		})
	}
}

func readProc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Skipf("%v: this kernel does not say which congestion controls it has", err)
	}
	return string(b)
}

// TestTCPCongestionRefused checks that a name the kernel cannot set, or
// that is no name, is refused up front, saying what to pick.
func TestTCPCongestionRefused(t *testing.T) {
	for _, bad := range []string{"nosuchcc", "Reno", "re no", "reno\x00", strings.Repeat("a", 16), "../reno"} {
		err := CheckTCPCongestion(bad)
		if err == nil || !strings.Contains(err.Error(), "congestion control") || len(err.Error()) > 300 {
			t.Errorf("%q: %v, want it refused briefly", bad, err)
			continue
		}
		if _, err := NewTCP(t.Context(), TCPConfig{Rank: 0, Size: 2, Store: NewMemStore(), Secret: tpSecret,
			Prefix: "job/0/tcp", Bind: "127.0.0.1:0", Advertise: "127.0.0.1", Congestion: bad}); err == nil {
			t.Errorf("NewTCP took congestion control %q", bad)
		}
	}
	if err := CheckTCPCongestion("nosuchcc"); err == nil || !strings.Contains(err.Error(), "tcp_allowed_congestion_control") {
		t.Errorf("an unknown name: %v, want the sysctl that lists the allowed ones named", err)
	}
	for _, ok := range []string{"", TCPCongestionSystem, DefaultTCPCongestion} {
		if err := CheckTCPCongestion(ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}
