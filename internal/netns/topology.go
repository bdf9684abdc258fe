package netns

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"strings"
)

// The topology of a cluster with id X:
//
//	root namespace                 gtrX-sw                 gtrX-hI
//	gtrX-up 10.a.b.1 ─veth─ uplink ─┐
//	                                br0 ── pI ─veth─ eth0 10.a.b.(10+I)
//
// The bridge lives in its own namespace, not the root one: a root-namespace
// bridge is subject to the host's firewall through br_netfilter (Docker sets
// FORWARD to DROP), which would silently break host-to-host traffic. The
// hosts have no default route, so nothing they send can leave the machine.

const (
	bridge     = "br0"
	uplinkPeer = "uplink" // the switch-side end of the root uplink
	hostIf     = "eth0"
	firstHost  = 10 // host i is .(firstHost+i)
	maxHosts   = 200
)

func (c *Cluster) nsName(suffix string) string { return namePrefix + c.id + "-" + suffix }

// chooseSubnet picks a random 10.a.b.0/24 that overlaps no IPv4 route of
// the root namespace (any table) and no live cluster's subnet, so traffic to
// it can only reach this cluster. Call with the lock held.
func chooseSubnet(recs map[string]record) (netip.Prefix, error) {
	out, err := ip("-4", "-j", "route", "show", "table", "all")
	if err != nil {
		return netip.Prefix{}, err
	}
	var routes []struct{ Dst string }
	if err := json.Unmarshal([]byte(out), &routes); err != nil {
		return netip.Prefix{}, fmt.Errorf("ip -j route: %w", err)
	}
	var taken []netip.Prefix
	for _, r := range routes {
		if p, ok := parseDst(r.Dst); ok {
			taken = append(taken, p)
		}
	}
	for _, r := range recs {
		if r.alive() {
			if p, err := netip.ParsePrefix(r.Subnet); err == nil {
				taken = append(taken, p)
			}
		}
	}
	for range 1000 {
		p := netip.PrefixFrom(netip.AddrFrom4([4]byte{10, byte(16 + rand.IntN(239)), byte(rand.IntN(256)), 0}), 24)
		if !overlapsAny(p, taken) {
			return p, nil
		}
	}
	return netip.Prefix{}, errors.New("no free 10.x.y.0/24 subnet: the routing table covers 10.0.0.0/8")
}

// parseDst parses a route destination; "default" (0/0) is skipped since it
// overlaps everything and does not make an address ambiguous.
func parseDst(dst string) (netip.Prefix, bool) {
	if dst == "" || dst == "default" {
		return netip.Prefix{}, false
	}
	if !strings.Contains(dst, "/") {
		a, err := netip.ParseAddr(dst)
		if err != nil {
			return netip.Prefix{}, false
		}
		return netip.PrefixFrom(a, a.BitLen()), true
	}
	p, err := netip.ParsePrefix(dst)
	return p, err == nil
}

func overlapsAny(p netip.Prefix, taken []netip.Prefix) bool {
	for _, q := range taken {
		if p.Overlaps(q) {
			return true
		}
	}
	return false
}

// addr returns the address .last in the cluster's subnet.
func (c *Cluster) addr(last int) string {
	a := c.subnet.Addr().As4()
	a[3] = byte(last)
	return netip.AddrFrom4(a).String()
}

// buildNetwork creates the switch namespace, the root uplink and one host
// namespace per host, and fills c.Hosts.
func (c *Cluster) buildNetwork(n int) error {
	sw := c.nsName("sw")
	steps := [][]string{
		{"netns", "add", sw},
		{"-n", sw, "link", "add", "name", bridge, "type", "bridge", "stp_state", "0", "forward_delay", "0"},
		{"-n", sw, "link", "set", "dev", bridge, "up"},
		{"link", "add", "name", c.uplink, "type", "veth", "peer", "name", uplinkPeer, "netns", sw},
		{"-n", sw, "link", "set", "dev", uplinkPeer, "master", bridge, "up"},
		{"addr", "add", c.LauncherIP + "/24", "dev", c.uplink},
		{"link", "set", "dev", c.uplink, "up"},
	}
	for i := range n {
		h := Host{Name: fmt.Sprintf("h%d", i), NS: c.nsName(fmt.Sprintf("h%d", i)), IP: c.addr(firstHost + i), Port: 22}
		c.Hosts = append(c.Hosts, h)
		port := fmt.Sprintf("p%d", i)
		steps = append(steps,
			[]string{"netns", "add", h.NS},
			[]string{"-n", sw, "link", "add", "name", port, "type", "veth", "peer", "name", hostIf, "netns", h.NS},
			[]string{"-n", sw, "link", "set", "dev", port, "master", bridge, "up"},
			[]string{"-n", h.NS, "addr", "add", h.IP + "/24", "dev", hostIf},
			[]string{"-n", h.NS, "link", "set", "dev", hostIf, "up"},
			[]string{"-n", h.NS, "link", "set", "dev", "lo", "up"},
		)
	}
	for _, s := range steps {
		if _, err := ip(s...); err != nil {
			return err
		}
	}
	return nil
}

// setPort sets host i's bridge port up or down. Down is a pulled cable:
// packets to and from the host are dropped without any RST or ICMP error.
func (c *Cluster) setPort(i int, state string) error {
	_, err := ip("-n", c.nsName("sw"), "link", "set", "dev", fmt.Sprintf("p%d", i), state)
	return err
}
