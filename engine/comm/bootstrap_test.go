package comm

import (
	"fmt"
	"testing"
	"time"
)

// tpBoot returns a maker of bootstrapped transports for ranks on the given
// hosts ("" means this host's real id). TCP binds loopback; it advertises
// loopback too unless every host is this one, where Connect must pick
// loopback by itself.
func tpBoot(t *testing.T, hosts []string, noSHM bool, dir string) func(rank int) (Transport, error) {
	advertise := "127.0.0.1"
	if hostsAllSame(hosts) && hosts[0] == "" {
		advertise = ""
	}
	store := NewMemStore()
	return func(rank int) (Transport, error) {
		return Connect(t.Context(), BootstrapConfig{
			Rank: rank, Size: len(hosts), Store: store, Secret: tpSecret, Prefix: "job/0",
			HostID: hosts[rank], NoSHM: noSHM,
			TCP: TCPConfig{Bind: "127.0.0.1:0", Advertise: advertise, DialTimeout: 5 * time.Second},
			SHM: SHMConfig{Dir: dir, RingBytes: 64 << 10},
		})
	}
}

func TestBootstrapRoutes(t *testing.T) {
	cases := []struct {
		name  string
		hosts []string
		noSHM bool
		want  func(r, p int) string
	}{
		{"one-host", []string{"", "", "", ""}, false, func(r, p int) string { return "shm" }},
		{"two-hosts", []string{"a", "a", "b", "b"}, false, func(r, p int) string {
			return map[bool]string{true: "shm", false: "tcp"}[r/2 == p/2]
		}},
		{"no-shm", []string{"", "", ""}, true, func(r, p int) string { return "tcp" }},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			ts, links := tpMesh(t, len(tc.hosts), tpBoot(t, tc.hosts, tc.noSHM, dir))
			for r := range ts {
				for p := range ts {
					if p == r {
						continue
					}
					got := ts[r].(*routedTransport).kind(p)
					if want := tc.want(r, p); got != want || tpConnKind(links[r][p]) != want {
						t.Errorf("rank %d → %d: routed over %s (link %s), want %s", r, p, got, tpConnKind(links[r][p]), want)
					}
				}
			}
			tpExchange(t, links, []int{0, 100, 200 << 10})
			tpCheckGroups(t, ts)
			tpNoLitter(t, dir)
		})
	}
}

func tpConnKind(c Conn) string {
	switch c.(type) {
	case *tcpConn:
		return "tcp"
	case *shmConn:
		return "shm"
	}
	return fmt.Sprintf("%T", c)
}

func TestLocalHostID(t *testing.T) {
	a, err := LocalHostID()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := LocalHostID()
	if a == "" || a != b {
		t.Fatalf("LocalHostID = %q, then %q; want a stable non-empty id", a, b)
	}
	t.Log(a)
}
