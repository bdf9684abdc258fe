package hostfiles

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Filter is the selection the user asked for; the zero value selects
// everything. Include and Exclude are mutually exclusive, and neither may be
// combined with NumNodes or NumSlots.
type Filter struct {
	Include  string // DeepSpeed syntax: "worker-0:0,2@worker-1"; only these hosts and slots
	Exclude  string // same syntax; remove these slots, or whole hosts when no slots are given
	NumNodes int    // > 0: keep only the first N hosts (hostfile order); 0 = all
	NumSlots int    // > 0: keep only the first N slots of each host ("--num-gpus"); 0 = all
}

// Select applies f to hosts (in hostfile order) and returns the nodes with
// their selected slots, in hostfile order. It never clamps or drops silently:
// unknown hosts, out-of-range slots, limits larger than the hostfile and an
// empty result are errors whose messages name the flag involved.
func Select(hosts []Host, f Filter) ([]Node, error) {
	if err := checkFilter(f); err != nil {
		return nil, err
	}
	if err := checkHosts(hosts); err != nil {
		return nil, err
	}
	var nodes []Node
	var err error
	switch {
	case f.Include != "":
		nodes, err = include(hosts, f.Include)
	case f.Exclude != "":
		nodes, err = exclude(hosts, f.Exclude)
	default:
		nodes, err = limit(hosts, f.NumNodes, f.NumSlots)
	}
	if err != nil {
		return nil, err
	}
	if n := countSlots(nodes); n > MaxRanks {
		return nil, fmt.Errorf("hostfiles: %d slots selected: a job has at most %d ranks; select fewer with --include, --exclude, --num-nodes or --num-gpus", n, MaxRanks)
	}
	return nodes, nil
}

func countSlots(nodes []Node) int {
	n := 0
	for _, nd := range nodes {
		n += len(nd.SlotIDs)
	}
	return n
}

// All returns every host with all its slots selected, the same as Select
// with a zero Filter.
func All(hosts []Host) []Node {
	nodes := make([]Node, 0, len(hosts))
	for _, h := range hosts {
		nodes = append(nodes, Node{Host: h, SlotIDs: firstSlots(h.Slots)})
	}
	return nodes
}

func firstSlots(n int) []int {
	ids := make([]int, max(n, 0))
	for i := range ids {
		ids[i] = i
	}
	return ids
}

func checkFilter(f Filter) error {
	switch {
	case f.NumNodes < 0:
		return fmt.Errorf("hostfiles: --num-nodes=%d: must be 0 (all hosts) or more", f.NumNodes)
	case f.NumSlots < 0:
		return fmt.Errorf("hostfiles: --num-gpus=%d: must be 0 (all slots) or more", f.NumSlots)
	case f.Include != "" && f.Exclude != "":
		return errors.New("hostfiles: --include and --exclude cannot be used together: keep one")
	}
	var limits []string
	if f.NumNodes > 0 {
		limits = append(limits, "--num-nodes")
	}
	if f.NumSlots > 0 {
		limits = append(limits, "--num-gpus")
	}
	if len(limits) == 0 || f.Include == "" && f.Exclude == "" {
		return nil
	}
	flag := "--include"
	if f.Exclude != "" {
		flag = "--exclude"
	}
	return fmt.Errorf("hostfiles: %s cannot be combined with %s: list the hosts and slots in %s instead",
		strings.Join(limits, " and "), flag, flag)
}

// checkHosts guards against hosts that did not come from Parse.
func checkHosts(hosts []Host) error {
	if len(hosts) == 0 {
		return errors.New("hostfiles: no hosts to select from")
	}
	seen := make(map[string]bool, len(hosts))
	slots := 0
	for _, h := range hosts {
		if h.Slots < 1 || h.Slots > MaxSlotsPerHost {
			return fmt.Errorf("hostfiles: host %q has %d slots: want 1 to %d", h.Name, h.Slots, MaxSlotsPerHost)
		}
		key := hostKey(h.Name)
		if seen[key] {
			return fmt.Errorf("hostfiles: duplicate host %q", h.Name)
		}
		seen[key] = true
		slots += h.Slots
	}
	if err := checkSize(len(hosts), slots); err != nil {
		return fmt.Errorf("hostfiles: %w", err)
	}
	return nil
}

func include(hosts []Host, value string) ([]Node, error) {
	picks, err := parseSelection("--include", value, hosts)
	if err != nil {
		return nil, err
	}
	var nodes []Node
	for i, h := range hosts {
		if p, ok := picks[i]; ok {
			ids := p.slots
			if p.all {
				ids = firstSlots(h.Slots)
			}
			nodes = append(nodes, Node{Host: h, SlotIDs: ids})
		}
	}
	return nodes, nil
}

func exclude(hosts []Host, value string) ([]Node, error) {
	picks, err := parseSelection("--exclude", value, hosts)
	if err != nil {
		return nil, err
	}
	var nodes []Node
	for i, h := range hosts {
		p, ok := picks[i]
		if ok && p.all {
			continue
		}
		ids := firstSlots(h.Slots)
		if ok {
			drop := make(map[int]bool, len(p.slots))
			for _, id := range p.slots {
				drop[id] = true
			}
			ids = slices.DeleteFunc(ids, func(id int) bool { return drop[id] })
		}
		if len(ids) > 0 {
			nodes = append(nodes, Node{Host: h, SlotIDs: ids})
		}
	}
	if len(nodes) == 0 {
		return nil, flagErr("--exclude", value, "every slot is excluded: leave at least one host or slot")
	}
	return nodes, nil
}

func limit(hosts []Host, numNodes, numSlots int) ([]Node, error) {
	if numNodes > len(hosts) {
		return nil, fmt.Errorf("hostfiles: --num-nodes=%d: the hostfile has only %d hosts (%s): lower --num-nodes",
			numNodes, len(hosts), hostList(hosts))
	}
	if numNodes > 0 {
		hosts = hosts[:numNodes]
	}
	if numSlots == 0 {
		return All(hosts), nil
	}
	var short []string
	for _, h := range hosts {
		if h.Slots < numSlots {
			short = append(short, fmt.Sprintf("%s has %d", h.Name, h.Slots))
		}
	}
	if len(short) > 0 {
		return nil, fmt.Errorf("hostfiles: --num-gpus=%d: more slots than some hosts have (%s): lower --num-gpus",
			numSlots, truncate(short))
	}
	nodes := make([]Node, 0, len(hosts))
	for _, h := range hosts {
		nodes = append(nodes, Node{Host: h, SlotIDs: firstSlots(numSlots)})
	}
	return nodes, nil
}

// pick is what an include/exclude entry says about one host.
type pick struct {
	all   bool  // no slots given: the whole host
	slots []int // sorted, when !all
}

// parseSelection parses DeepSpeed's "host[:s,s]@host..." syntax into picks
// keyed by index in hosts.
func parseSelection(flag, value string, hosts []Host) (map[int]pick, error) {
	index := make(map[string]int, len(hosts))
	for i, h := range hosts {
		index[hostKey(h.Name)] = i
	}
	picks := make(map[int]pick)
	for _, entry := range strings.Split(value, "@") {
		name, list, hasList, err := splitEntry(entry)
		if err != nil {
			return nil, flagErr(flag, value, "%v", err)
		}
		i, ok := index[hostKey(name)]
		if !ok {
			return nil, flagErr(flag, value, "unknown host %q (hosts: %s)", name, hostList(hosts))
		}
		if _, dup := picks[i]; dup {
			return nil, flagErr(flag, value, "host %q is listed twice: merge its slots into one entry", name)
		}
		p := pick{all: !hasList}
		if hasList {
			if p.slots, err = parseSlots(hosts[i], list); err != nil {
				return nil, flagErr(flag, value, "%v", err)
			}
		}
		picks[i] = p
	}
	return picks, nil
}

// splitEntry splits "host", "host:slots", "[ipv6]" or "[ipv6]:slots". An
// unbracketed entry with two or more colons is an IPv6 address without slots.
func splitEntry(entry string) (name, list string, hasList bool, err error) {
	switch {
	case entry == "":
		return "", "", false, errors.New(`empty entry: check for "@@" or a "@" at either end`)
	case strings.HasPrefix(entry, "["):
		end := strings.IndexByte(entry, ']')
		if end < 0 {
			return "", "", false, fmt.Errorf("missing \"]\" in %q: write [addr] or [addr]:slots", entry)
		}
		rest := entry[end+1:]
		name = entry[1:end]
		if rest != "" && rest[0] != ':' {
			return "", "", false, fmt.Errorf("unexpected %q after \"]\" in %q: write [addr]:slots", rest, entry)
		}
		list, hasList = strings.CutPrefix(rest, ":")
	case strings.Count(entry, ":") >= 2:
		name = entry
	default:
		name, list, hasList = strings.Cut(entry, ":")
	}
	if name == "" {
		return "", "", false, fmt.Errorf("empty host name in %q", entry)
	}
	return name, list, hasList, nil
}

// parseSlots parses "0,2,3" for h, refusing anything outside [0, h.Slots).
func parseSlots(h Host, list string) ([]int, error) {
	if list == "" {
		return nil, fmt.Errorf("no slots after %q: list slots like %s:0,1, or drop the \":\" for all", h.Name+":", h.Name)
	}
	var ids []int
	seen := make(map[int]bool)
	for _, s := range strings.Split(list, ",") {
		if s == "" {
			return nil, fmt.Errorf("empty slot in %q for host %q: check the commas", list, h.Name)
		}
		id, err := parseDigits(s)
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return nil, fmt.Errorf("invalid slot %q for host %q: want a slot index like 0", s, h.Name)
		}
		if err != nil || id >= h.Slots {
			return nil, fmt.Errorf("slot %s out of range for host %q: it has %d slots (0-%d)", s, h.Name, h.Slots, h.Slots-1)
		}
		if seen[id] {
			return nil, fmt.Errorf("slot %d listed twice for host %q", id, h.Name)
		}
		seen[id] = true
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

func flagErr(flag, value, format string, args ...any) error {
	return fmt.Errorf("hostfiles: %s %q: %s", flag, value, fmt.Sprintf(format, args...))
}

func hostList(hosts []Host) string {
	names := make([]string, len(hosts))
	for i, h := range hosts {
		names[i] = h.Name
	}
	return truncate(names)
}

// truncate joins items with ", ", keeping long lists to one readable line.
func truncate(items []string) string {
	const keep = 8
	if len(items) <= keep {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s, ... and %d more", strings.Join(items[:keep], ", "), len(items)-keep)
}
