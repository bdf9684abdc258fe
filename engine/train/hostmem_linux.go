package train

import (
	"bufio"
	"bytes"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// maxProcRead bounds every read of a /proc or cgroup file here: each is
// well under a page, and a file that is not what it should be must not be
// read without end.
const maxProcRead = 16 << 10

// hostMemory reads this host's memory: capacity, the most the ranks of a
// job on it can ever hold together (MemTotal, or a cgroup limit of this
// process when lower); now, what is free for them at this moment
// (MemAvailable, or the room under the cgroup limit); and process, the
// room under this process's address-space limit (ulimit -v), which bounds
// each rank alone. A limit that could not be read is zero.
func hostMemory() (capacity, now, process memLimit) {
	least := func(l *memLimit, v float64, from string) {
		if v >= 0 && (!l.known() || v < l.bytes) {
			*l = memLimit{v, from}
		}
	}
	if b, err := readSmall("/proc/meminfo"); err == nil {
		if v, ok := keyedValue(b, "MemTotal", 1024); ok {
			least(&capacity, v, "MemTotal in /proc/meminfo")
		}
		if v, ok := keyedValue(b, "MemAvailable", 1024); ok {
			least(&now, v, "MemAvailable in /proc/meminfo")
		}
	}
	if limit, room, ok := cgroupMemory(); ok {
		least(&capacity, limit, "the cgroup memory limit")
		least(&now, room, "room under the cgroup memory limit")
	}
	if v, ok := addressSpaceRoom(); ok {
		least(&process, v, "the address-space limit, ulimit -v")
	}
	return capacity, now, process
}

// readSmall reads at most maxProcRead bytes of path.
func readSmall(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxProcRead))
}

// keyedValue is the number after "key" (and a colon, for /proc/meminfo) on
// a line of b, times unit; false unless it is a finite number ≥ 0.
func keyedValue(b []byte, key string, unit float64) (float64, bool) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 2 && strings.TrimSuffix(f[0], ":") == key {
			v, err := strconv.ParseFloat(f[1], 64)
			ok := err == nil && v >= 0 && !math.IsInf(v, 0)
			return v * unit, ok
		}
	}
	return 0, false
}

// cgroupMemory is the least memory limit set on this process's cgroup or
// its ancestors (v2 or v1), and the least room under one: limit − (usage −
// inactive page cache), the cache being reclaimable.
func cgroupMemory() (limit, room float64, ok bool) {
	b, err := readSmall("/proc/self/cgroup")
	if err != nil {
		return 0, 0, false
	}
	for _, line := range strings.Split(string(b), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		var w cgroupFiles
		switch {
		case parts[0] == "0" && parts[1] == "":
			w = cgroupFiles{"/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file"}
		case strings.Contains(","+parts[1]+",", ",memory,"):
			w = cgroupFiles{"/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"}
		default:
			continue
		}
		l, r, found := w.walk(parts[2])
		switch {
		case !found:
		case !ok:
			limit, room, ok = l, r, true
		default:
			limit, room = min(limit, l), min(room, r)
		}
	}
	return limit, room, ok
}

// cgroupFiles names a cgroup hierarchy's mount and memory files.
type cgroupFiles struct {
	root, limit, usage, cacheKey string
}

// walk goes from the cgroup at root/path up to root and returns the least
// limit and the least room under one set on the way. Inside a cgroup
// namespace the path is "/" and root is the namespace's own cgroup.
func (w cgroupFiles) walk(path string) (limit, room float64, found bool) {
	dir := filepath.Join(w.root, filepath.Clean("/"+path))
	for {
		if l, r, ok := w.level(dir); ok {
			if !found {
				limit, room = l, r
			}
			limit, room, found = min(limit, l), min(room, r), true
		}
		if len(dir) <= len(w.root) {
			return limit, room, found
		}
		dir = filepath.Dir(dir)
	}
}

// level is one cgroup's limit and the room under it; false when it sets
// none ("max", or v1's near-2^63 "unlimited").
func (w cgroupFiles) level(dir string) (limit, room float64, ok bool) {
	limit, ok = readNumber(filepath.Join(dir, w.limit))
	if !ok || limit >= 1<<62 {
		return 0, 0, false
	}
	usage, ok := readNumber(filepath.Join(dir, w.usage))
	if !ok {
		return 0, 0, false
	}
	if sb, err := readSmall(filepath.Join(dir, "memory.stat")); err == nil {
		if cache, ok := keyedValue(sb, w.cacheKey, 1); ok {
			usage = max(usage-cache, 0)
		}
	}
	return limit, max(limit-usage, 0), true
}

// readNumber is the number a small file holds.
func readNumber(path string) (float64, bool) {
	b, err := readSmall(path)
	if err != nil {
		return 0, false
	}
	v, err := strconv.ParseFloat(strings.TrimSpace(string(b)), 64)
	return v, err == nil
}

// addressSpaceRoom is RLIMIT_AS less the address space this process maps
// already (the first field of /proc/self/statm, in pages).
func addressSpaceRoom() (float64, bool) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_AS, &lim); err != nil || lim.Cur == ^uint64(0) || lim.Cur >= 1<<62 {
		return 0, false
	}
	b, err := readSmall("/proc/self/statm")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, false
	}
	pages, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return 0, false
	}
	return max(float64(lim.Cur)-pages*float64(os.Getpagesize()), 0), true
}
