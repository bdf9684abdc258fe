package netns

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// stateDir holds one record per live cluster and the lock that serialises
// creating and sweeping clusters across processes (parallel test binaries).
const stateDir = "/run/gtrain-netns"

// namePrefix starts every namespace and root-namespace link this package
// makes; the 8 hex digits after it are the cluster id.
const namePrefix = "gtr"

var ownedName = regexp.MustCompile(`^` + namePrefix + `([0-9a-f]{8})-`)

// record is written before a cluster creates anything, so a sweep can tell
// a live cluster (creator still running) from one left by a crashed run.
type record struct {
	PID     int       `json:"pid"`
	Start   string    `json:"start"` // /proc/<pid>/stat starttime: guards against pid reuse
	Subnet  string    `json:"subnet"`
	Created time.Time `json:"created"`
}

func recordPath(id string) string { return filepath.Join(stateDir, id+".json") }

func newID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b) // never fails on Linux
	return hex.EncodeToString(b)
}

// withLock runs f holding the cross-process lock in stateDir.
func withLock(f func() error) error {
	if err := os.MkdirAll(stateDir, 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(stateDir, "lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return fmt.Errorf("open lock: %w", err)
	}
	defer lf.Close() // releases the flock
	if err := lockFile(lf); err != nil {
		return fmt.Errorf("lock %s: %w", lf.Name(), err)
	}
	return f()
}

// procStart returns the start time of pid (field 22 of /proc/<pid>/stat),
// or "" if there is no such process.
func procStart(pid int) string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return ""
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 20 {
		return ""
	}
	return f[19]
}

func (r record) alive() bool { return r.Start != "" && procStart(r.PID) == r.Start }

func writeRecord(id string, r record) error {
	b, _ := json.Marshal(r)
	if err := os.WriteFile(recordPath(id), b, 0o644); err != nil {
		return fmt.Errorf("write record: %w", err)
	}
	return nil
}

// readRecords returns the records in stateDir by cluster id; unreadable
// records are returned as zero records, which count as dead.
func readRecords() map[string]record {
	recs := map[string]record{}
	paths, _ := filepath.Glob(filepath.Join(stateDir, "*.json"))
	for _, p := range paths {
		var r record
		b, err := os.ReadFile(p)
		if err == nil {
			_ = json.Unmarshal(b, &r)
		}
		recs[strings.TrimSuffix(filepath.Base(p), ".json")] = r
	}
	return recs
}

// owned lists this package's namespaces and root-namespace links, by id.
func owned() (nss, links map[string][]string, err error) {
	nss, links = map[string][]string{}, map[string][]string{}
	names, err := namespaces()
	if err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		if m := ownedName.FindStringSubmatch(n); m != nil {
			nss[m[1]] = append(nss[m[1]], n)
		}
	}
	if names, err = rootLinks(); err != nil {
		return nil, nil, err
	}
	for _, n := range names {
		if m := ownedName.FindStringSubmatch(n); m != nil {
			links[m[1]] = append(links[m[1]], n)
		}
	}
	return nss, links, nil
}

// sweepStale removes what crashed runs left behind: every id whose record
// is missing or whose creator is dead. Call with the lock held. A record is
// always written (under the lock) before anything is created, so an id
// without a record cannot belong to a cluster being built.
func sweepStale() error {
	recs := readRecords()
	nss, links, err := owned()
	if err != nil {
		return err
	}
	ids := map[string]bool{}
	for id := range recs {
		ids[id] = true
	}
	for id := range nss {
		ids[id] = true
	}
	for id := range links {
		ids[id] = true
	}
	var errs []error
	for id := range ids {
		if r, ok := recs[id]; ok && r.alive() {
			continue
		}
		if err := destroy(nss[id], links[id]); err != nil {
			errs = append(errs, fmt.Errorf("stale cluster %s: %w", id, err))
			continue
		}
		_ = os.Remove(recordPath(id))
	}
	return errors.Join(errs...)
}

// destroy kills every process inside the namespaces, then deletes the
// links and the namespaces. It keeps going after errors and reports them all.
func destroy(nss, links []string) error {
	var errs []error
	for _, ns := range nss {
		if err := killAll(ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Deleting one end of a veth deletes both; the namespaces' own links go
	// with the namespaces.
	for _, l := range links {
		if _, err := ip("link", "del", "dev", l); err != nil && linkExists(l) {
			errs = append(errs, err)
		}
	}
	for _, ns := range nss {
		if _, err := ip("netns", "del", ns); err != nil && nsExists(ns) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// killAll SIGKILLs every process in ns (sshd, its sessions, anything a test
// started there) and waits until none is left, so the namespace can go.
func killAll(ns string) error {
	deadline := time.Now().Add(5 * time.Second)
	for {
		pids, err := nsPids(ns)
		if err != nil || len(pids) == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v in namespace %s survive SIGKILL (stuck in D state?)", pids, ns)
		}
		for _, pid := range pids {
			_ = kill(pid, syscall.SIGKILL)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func nsPids(ns string) ([]int, error) {
	out, err := ip("netns", "pids", ns)
	if err != nil {
		if !nsExists(ns) {
			return nil, nil
		}
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(out) {
		if pid, err := strconv.Atoi(f); err == nil {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

func namespaces() ([]string, error) {
	out, err := ip("-j", "netns", "list")
	if err != nil {
		return nil, err
	}
	var list []struct{ Name string }
	if strings.TrimSpace(out) != "" {
		if err := json.Unmarshal([]byte(out), &list); err != nil {
			return nil, fmt.Errorf("ip -j netns list: %w", err)
		}
	}
	names := make([]string, len(list))
	for i, e := range list {
		names[i] = e.Name
	}
	return names, nil
}

func rootLinks() ([]string, error) {
	out, err := ip("-j", "link", "show")
	if err != nil {
		return nil, err
	}
	var list []struct{ Ifname string }
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		return nil, fmt.Errorf("ip -j link show: %w", err)
	}
	names := make([]string, len(list))
	for i, e := range list {
		names[i] = e.Ifname
	}
	return names, nil
}

func nsExists(ns string) bool {
	_, err := os.Stat(filepath.Join("/run/netns", ns))
	return err == nil
}

func linkExists(name string) bool {
	_, err := os.Stat(filepath.Join("/sys/class/net", name))
	return err == nil
}
