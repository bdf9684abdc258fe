package detect

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/gtrain/gtrain/internal/userfile"
)

// fileLimit bounds every read: the sysfs and procfs files detection reads
// are a line or a few (a cpulist, a meminfo of ~30 lines), and /proc/cpuinfo
// is read only up to its first "model name".
const fileLimit = 64 << 10

// dirLimit bounds the entries taken from one directory (CPUs, NUMA nodes,
// network interfaces, RDMA ports): a host with more is not one gtrain plans.
const dirLimit = 1 << 12

// fsys reads the files of one host below root ("/" for this machine, a
// fixture tree in tests). A file that is missing or unreadable is unknown,
// not an error: containers hide parts of sysfs, and old kernels lack them.
type fsys struct{ root string }

func (f fsys) path(p string) string { return filepath.Join(f.root, filepath.FromSlash(p)) }

// read returns the file's first fileLimit bytes, trimmed, and whether it
// could be read.
func (f fsys) read(p string) (string, bool) { return f.readLimit(p, fileLimit) }

// readLimit is read with its own bound, for the few files that can be
// longer (/proc/self/mountinfo).
func (f fsys) readLimit(p string, limit int64) (string, bool) {
	file, err := os.Open(f.path(p))
	if err != nil {
		return "", false
	}
	defer file.Close()
	data, err := io.ReadAll(io.LimitReader(file, limit))
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(string(data)), true
}

// int reads a file holding one integer; ok is false when it does not.
func (f fsys) int(p string) (int, bool) {
	s, ok := f.read(p)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// list reads a file holding a CPU or node list.
func (f fsys) list(p string) ([]int, bool) {
	s, ok := f.read(p)
	if !ok {
		return nil, false
	}
	ids, err := ParseList(s)
	return ids, err == nil
}

// exists reports whether p exists (a sysfs symlink is followed).
func (f fsys) exists(p string) bool {
	_, err := os.Stat(f.path(p))
	return err == nil
}

// names lists the entries of directory p with the given prefix, sorted,
// at most dirLimit of them.
func (f fsys) names(p, prefix string) []string {
	// Scanning is bounded too: a host may hold thousands of veth
	// interfaces, none of them wanted.
	out := userfile.Names(f.path(p), prefix, 16*dirLimit, dirLimit)
	slices.Sort(out)
	return out
}

// numbered returns the ids of the entries prefix<N> of directory p
// ("node0", "cpu12"), in numeric order.
func (f fsys) numbered(p, prefix string) []int {
	var ids []int
	for _, n := range f.names(p, prefix) {
		if id, err := strconv.Atoi(strings.TrimPrefix(n, prefix)); err == nil && id >= 0 && id <= MaxCPU {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}
