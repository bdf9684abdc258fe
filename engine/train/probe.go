package train

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/userfile"
)

// Rank 0 commits a checkpoint only when it sees every rank's file, so the
// ranks of a job on several hosts need checkpoint.dir on a filesystem that
// every host mounts. probeShared checks that before the first step, rather
// than at the first checkpoint, an hour into the run.

// probeWait bounds how long rank 0 waits for the probes to appear: a
// network filesystem may show a file another host created a moment
// later, never one that host wrote elsewhere.
var probeWait = 10 * time.Second

// probeHostBytes is the most of a host name the probes' all-gather
// carries.
const probeHostBytes = 64

// probeWords is one rank's part of the all-gather, in 16-bit words
// (copied bit for bit, as shareFiles' are): a flag (1: the probe is
// written), the probe's nonce (8 bytes) and the host's name.
const probeWords = (2 + 8 + probeHostBytes) / 2

// testHookProbeDir, when set by a test, names the directory rank writes
// its probe in, instead of checkpoint.dir (a filesystem rank 0 does not
// see).
var testHookProbeDir func(rank int, dir string) string

// probeShared checks, for a job with ranks on more than one host, that
// checkpoint.dir is one directory for all of them: each rank writes a
// probe file there holding a random nonce, an all-gather tells rank 0
// every nonce and host, and rank 0 reads every probe back (waiting up to
// probeWait for them to appear). The job refuses to start, naming the
// ranks and hosts rank 0 cannot see, if any is missing. The probes are
// removed afterwards.
func (t *Trainer) probeShared() error {
	env := t.env
	if env.Comm == nil || max(env.LocalWorld, 1) >= env.World {
		return nil // one host: every rank sees the directory rank 0 sees
	}
	dir := t.spec.Checkpoint.Dir
	nonce, path, werr := t.writeProbe()
	if path != "" {
		defer func() {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				env.Warn(fmt.Sprintf("train: remove probe %s: %v", path, err))
			}
		}()
	}
	all, err := t.gatherProbes(werr == nil, nonce)
	if err != nil {
		return fmt.Errorf("train: check checkpoint.dir %s is shared: %w", dir, errors.Join(werr, err))
	}
	var verdict error
	if failed := unwritten(all); env.Rank == 0 && len(failed) > 0 {
		verdict = fmt.Errorf("train: checkpoint.dir %s: %s could not write a probe file there (see its error); give a checkpoint.dir that every host mounts and can write",
			dir, onHosts(all, failed))
	} else if env.Rank == 0 {
		verdict = checkProbes(t.ctx(), dir, all)
	}
	err = t.agree(verdict, "found checkpoint.dir "+dir+" is not shared by every host")
	if werr != nil {
		return werr // this rank's own reason, more precise than rank 0's
	}
	return err
}

// writeProbe writes this rank's probe, a random nonce, and returns the
// nonce and the probe's path ("" when none was created).
func (t *Trainer) writeProbe() (nonce [8]byte, path string, err error) {
	dir := t.spec.Checkpoint.Dir
	if testHookProbeDir != nil {
		dir = testHookProbeDir(t.env.Rank, dir)
	}
	rand.Read(nonce[:])
	fail := func(err error) ([8]byte, string, error) {
		return nonce, "", fmt.Errorf("train: checkpoint.dir %s: rank %d on host %s cannot write a probe file there: %w; give a checkpoint.dir that every host mounts and can write",
			t.spec.Checkpoint.Dir, t.env.Rank, t.hostName(), err)
	}
	// The directory exists where rank 0 created it; a host that mounts
	// no shared filesystem there creates its own, and rank 0 says so.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(err)
	}
	path = filepath.Join(dir, probeName(t.env.Rank))
	if err := os.WriteFile(path, nonce[:], 0o644); err != nil {
		os.Remove(path)
		return fail(err)
	}
	return nonce, path, nil
}

// probeName is rank's probe file: a temporary file's name (atomicfile's),
// so that one a killed rank leaves behind reads as a leftover.
func probeName(rank int) string { return ".gtrain-probe.tmp-rank-" + strconv.Itoa(rank) }

// probe is what a rank's part of the all-gather says.
type probe struct {
	written bool
	nonce   [8]byte
	host    string
}

// gatherProbes gives every rank each rank's probe.
func (t *Trainer) gatherProbes(written bool, nonce [8]byte) ([]probe, error) {
	b := make([]byte, 2*probeWords)
	if written {
		b[0] = 1
	}
	copy(b[2:10], nonce[:])
	copy(b[10:], t.hostName())
	mine := make([]uint16, probeWords)
	for i := range mine {
		mine[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	words := make([]uint16, probeWords*t.env.World)
	if err := t.env.Comm.AllGather(t.ctx(), comm.BF16(mine), comm.BF16(words)); err != nil {
		return nil, err
	}
	out := make([]probe, t.env.World)
	for r := range out {
		for i, v := range words[r*probeWords : (r+1)*probeWords] {
			binary.LittleEndian.PutUint16(b[2*i:], v)
		}
		out[r].written = b[0] == 1
		copy(out[r].nonce[:], b[2:10])
		out[r].host = string(bytes.TrimRight(b[10:], "\x00"))
	}
	return out, nil
}

// hostName is the rank's host as the hostfile names it, else as the
// system does.
func (t *Trainer) hostName() string {
	h := t.env.Host
	if h == "" {
		h, _ = os.Hostname()
	}
	if len(h) > probeHostBytes {
		h = h[:probeHostBytes]
	}
	return h
}

// checkProbes is rank 0's check: every rank's probe in dir, with its
// nonce, within probeWait. The error names the ranks whose probe it
// cannot see, and their hosts.
func checkProbes(ctx context.Context, dir string, all []probe) error {
	deadline := time.Now().Add(probeWait)
	pause := 10 * time.Millisecond
	for {
		missing := unseenProbes(dir, all)
		if len(missing) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return notSharedError(dir, all, missing)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("train: check checkpoint.dir %s is shared: %w", dir, context.Cause(ctx))
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// unseenProbes is the ranks whose probe is not in dir with their nonce
// (those that could not write one included).
func unseenProbes(dir string, all []probe) []int {
	var missing []int
	for r, p := range all {
		b, err := userfile.ReadRegular(filepath.Join(dir, probeName(r)), int64(len(p.nonce)))
		if !p.written || err != nil || !bytes.Equal(b, p.nonce[:]) {
			missing = append(missing, r)
		}
	}
	return missing
}

// unwritten is the ranks that could not write their probe.
func unwritten(all []probe) []int {
	var rs []int
	for r, p := range all {
		if !p.written {
			rs = append(rs, r)
		}
	}
	return rs
}

// notSharedError says which ranks' probes rank 0 (on all[0]'s host)
// cannot see in dir.
func notSharedError(dir string, all []probe, missing []int) error {
	verb := "wrote a probe"
	if len(missing) > 1 {
		verb = "wrote probes"
	}
	return fmt.Errorf("train: checkpoint.dir %s is not shared: %s %s that rank 0 on host %s cannot see; rank 0 commits a checkpoint only when it sees every rank's file: put checkpoint.dir on a filesystem every host mounts",
		dir, onHosts(all, missing), verb, all[0].host)
}

// onHosts names ranks rs grouped by host ("ranks 2, 3 on host b; rank 5
// on host c"), the first few only.
func onHosts(all []probe, rs []int) string {
	const most = 16 // a whole host missing reads as one group anyway
	var hosts []string
	byHost := map[string][]string{}
	for _, r := range rs[:min(len(rs), most)] {
		h := all[r].host
		if _, ok := byHost[h]; !ok {
			hosts = append(hosts, h)
		}
		byHost[h] = append(byHost[h], strconv.Itoa(r))
	}
	var who []string
	for _, h := range hosts {
		noun := "rank "
		if len(byHost[h]) > 1 {
			noun = "ranks "
		}
		who = append(who, noun+strings.Join(byHost[h], ", ")+" on host "+h)
	}
	if len(rs) > most {
		who = append(who, fmt.Sprintf("%d more ranks", len(rs)-most))
	}
	return strings.Join(who, "; ")
}
