package hostfiles

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
)

// Bounds on what a hostfile may describe, so that a typo or a hostile file
// (slots=100000000, /dev/zero) is refused with a clear error instead of
// exhausting the launcher's memory.
const (
	// MaxSlotsPerHost bounds slots= and max_slots= (ranks on one host). The
	// largest machines have 8 to 16 GPUs, or a few hundred cores for CPU
	// ranks. Each rank of a host gets the host's whole slot list
	// (CUDA_VISIBLE_DEVICES), so a job's plan grows with ranks × slots per
	// host: at 1024 and MaxRanks, some 300 MB.
	MaxSlotsPerHost = 1024
	// MaxHosts bounds the hosts of one hostfile.
	MaxHosts = 65536
	// MaxFileSlots bounds the slots of one hostfile, all hosts together: a
	// cluster's hostfile may list more slots than one job uses (selected
	// with the filters), but selecting is done slot by slot, in memory.
	MaxFileSlots = 1 << 20
	// MaxRanks bounds the ranks a selection may hold: the world size of one
	// job. The largest published training jobs ran on some 16384 to 32768
	// GPUs; the launcher keeps a plan, an environment and a status channel
	// per rank.
	MaxRanks = 65536
	// MaxFileSize bounds the size of a hostfile: a file of MaxHosts hosts
	// with long names is under 2 MiB.
	MaxFileSize = 4 << 20
)

// Host is one line of a hostfile.
type Host struct {
	Name     string // hostname or IP as written, without user@ and :port; the key used by include/exclude
	User     string // from user@host, "" if absent
	Port     int    // SSH port from host:port (only with slots=, see the package doc), 0 if absent
	Slots    int    // > 0
	MaxSlots int    // 0 if not given; else >= Slots
	Line     int    // 1-based line number in the file
}

// Addr returns the dial form "name" or "name:port". An IPv6 address is
// bracketed when it has a port: "[::1]:2222".
func (h Host) Addr() string {
	if h.Port == 0 {
		return h.Name
	}
	port := strconv.Itoa(h.Port)
	if strings.Contains(h.Name, ":") {
		return "[" + h.Name + "]:" + port
	}
	return h.Name + ":" + port
}

// Node is a host with the slot indices selected on it, sorted ascending, each
// in [0, Host.Slots).
type Node struct {
	Host
	SlotIDs []int
}

// Format renders h as one hostfile line in the long form,
// "[user@]host[:port] slots=N [max_slots=M]", bracketing IPv6 addresses.
// Parsing the line gives back h, apart from Line.
func Format(h Host) string {
	var b strings.Builder
	if h.User != "" {
		b.WriteString(h.User)
		b.WriteByte('@')
	}
	if strings.Contains(h.Name, ":") {
		b.WriteString("[" + h.Name + "]")
	} else {
		b.WriteString(h.Name)
	}
	if h.Port != 0 {
		b.WriteString(":" + strconv.Itoa(h.Port))
	}
	b.WriteString(" slots=" + strconv.Itoa(h.Slots))
	if h.MaxSlots != 0 {
		b.WriteString(" max_slots=" + strconv.Itoa(h.MaxSlots))
	}
	return b.String()
}

// ParseError reports a problem in a hostfile. Line is 0 when the problem is
// with the whole file, such as a file with no hosts.
type ParseError struct {
	File string // the name given to Parse, or the path given to ReadFile
	Line int    // 1-based line number, 0 for the whole file
	Msg  string // what is wrong and what to do, e.g. "missing slots: add slots=N"
}

// Error returns "hostfiles: file:line: msg".
func (e *ParseError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("hostfiles: %s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("hostfiles: %s: %s", e.File, e.Msg)
}

// hostKey is the identity of a host name: lower case, and IPv6 addresses in
// canonical form, so that two spellings of one machine count as duplicates.
func hostKey(name string) string {
	if strings.Contains(name, ":") {
		if addr, err := netip.ParseAddr(name); err == nil {
			return strings.ToLower(addr.String())
		}
	}
	return strings.ToLower(name)
}
