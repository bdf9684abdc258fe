package detect

import (
	"path"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/hostinfo"
)

// nics lists the interfaces fit for training traffic: every RDMA port
// (/sys/class/infiniband: InfiniBand, or RoCE when its link layer is
// Ethernet) with its netdev, then every other network interface backed by
// a device. The rule for the latter is the one lshw and NetworkManager
// use: a physical or SR-IOV interface has a "device" link in
// /sys/class/net/NAME; lo, veth pairs, bridges (docker0), bonds, VLANs and
// tunnels have none, and carry no traffic of their own.
func (f fsys) nics() []hostinfo.NIC {
	out := f.rdmaPorts()
	covered := map[string]bool{}
	for _, n := range out {
		covered[n.Name] = true
	}
	for _, name := range f.names("sys/class/net", "") {
		dir := "sys/class/net/" + name
		if covered[name] || !f.exists(dir+"/device") {
			continue
		}
		kind := "eth"
		if t, _ := f.int(dir + "/type"); t == 32 { // ARPHRD_INFINIBAND: IPoIB of an RDMA port not listed
			kind = "ib"
		}
		op, _ := f.read(dir + "/operstate")
		mbit, _ := f.int(dir + "/speed") // -1, or unreadable, while down
		out = append(out, hostinfo.NIC{Name: name, Kind: kind, GbitPerS: float64(max(mbit, 0)) / 1000,
			Up: op == "up", NUMANode: f.numaOf(dir + "/device")})
	}
	return out
}

// rdmaPorts lists each port of each RDMA device.
func (f fsys) rdmaPorts() []hostinfo.NIC {
	var out []hostinfo.NIC
	for _, dev := range f.names("sys/class/infiniband", "") {
		dir := "sys/class/infiniband/" + dev
		netdevs := f.names(dir+"/device/net", "")
		for _, port := range f.numbered(dir+"/ports", "") {
			p := dir + "/ports/" + strconv.Itoa(port)
			layer, _ := f.read(p + "/link_layer")
			state, _ := f.read(p + "/state")
			rate, _ := f.read(p + "/rate")
			nic := hostinfo.NIC{Name: f.portNetdev(p, dev, port, netdevs), Kind: "ib", Device: dev, Port: port,
				GbitPerS: gbitOf(rate), Up: strings.HasSuffix(state, "ACTIVE"), NUMANode: f.numaOf(dir + "/device")}
			if strings.EqualFold(layer, "Ethernet") {
				nic.Kind = "roce"
			}
			if !nic.Up {
				nic.GbitPerS = 0 // sysfs keeps the last rate of a port that went down
			}
			out = append(out, nic)
		}
	}
	return out
}

// portNetdev is the netdev of an RDMA port: RoCE ports name it in
// gid_attrs/ndevs/0; otherwise the port-th netdev of the PCI function
// (IPoIB's ib0), else the RDMA device's own name.
func (f fsys) portNetdev(port, dev string, n int, netdevs []string) string {
	if nd, ok := f.read(port + "/gid_attrs/ndevs/0"); ok && nd != "" && !strings.ContainsAny(nd, "/ \n") {
		return nd
	}
	if n >= 1 && n <= len(netdevs) {
		return netdevs[n-1]
	}
	return dev
}

// numaOf is a PCI device's NUMA node, -1 when unknown (the kernel writes -1
// on single-node hosts too).
func (f fsys) numaOf(device string) int {
	n, ok := f.int(path.Join(device, "numa_node"))
	if !ok || n < -1 || n > MaxCPU {
		return -1
	}
	return n
}

// gbitOf reads an RDMA port's rate, "400 Gb/sec (4X NDR)".
func gbitOf(rate string) float64 {
	num, _, _ := strings.Cut(rate, " ")
	g, err := strconv.ParseFloat(num, 64)
	if err != nil || !(g > 0) || g > 1e6 {
		return 0
	}
	return g
}
