package train

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/usage"
)

// The ranks of a job must train one job: a rank given another micro_batch,
// sequence length, model, precision, seed or optimizer setting computes
// gradients that the all-reduce averages with the others' as if they were
// alike, and the losses are wrong without any error. The launcher gives
// every rank the same spec, but per-node ranks resolve the job on their
// own node, and nothing else in the engine compares them. So every rank
// checks, before it builds anything, that all ranks resolved the same spec.

// digestChunks is the spec digest's 16-bit pieces: 64 bits, each piece an
// exact float32, so that one all-reduce of their maxima and negated
// maxima (the minima) says whether every rank has the same.
const digestChunks = 4

// maxSpecBytes bounds the encoded spec a rank takes from a peer to name
// the setting that differs (a spec is a few hundred bytes).
const maxSpecBytes = 1 << 20

// checkSameSpec fails on every rank, with the same message but its own
// rank, when the ranks' resolved specs differ in a setting that must be
// equal on every rank (comparedSpec). When they agree it costs one
// all-reduce of 8 floats; only a mismatch costs more collectives, to name
// the first setting in which the lowest differing rank departs from rank
// 0's spec. Every rank takes the same path, so none is left waiting.
func checkSameSpec(ctx context.Context, spec Spec, env Env) error {
	if env.Comm == nil {
		return nil
	}
	mine, err := json.Marshal(comparedSpec(spec))
	if err != nil {
		return fmt.Errorf("train: rank %d: job spec check: %w", env.Rank, err)
	}
	same, err := sameDigest(ctx, env.Comm, mine)
	if err != nil {
		return fmt.Errorf("train: rank %d: job spec check: %w", env.Rank, err)
	}
	if same {
		return nil
	}
	return usage.Errorf("train: rank %d: job spec check: %s: start every rank with the same job (the same job file, --set values and gtrain version)",
		env.Rank, describeDiff(ctx, env.Comm, mine))
}

// comparedSpec is spec less what may differ from rank to rank:
//   - threads is a host's: 0 resolves to its own cores, and a host of
//     another size may be given its own count; it changes no value the
//     ranks exchange.
//   - paths are resolved on each host (ResolveIn, against the job's
//     directory there; a rank started by hand picks its own run
//     directory), and hosts may mount the same files in other places. Only
//     whether each is set is compared: data.val and checkpoint.dir decide
//     whether the ranks evaluate and checkpoint, which are collectives. The
//     token files' contents are checked against the model where each rank
//     reads them, not against each other.
//   - log.tensorboard is written by rank 0 alone.
//   - model.preset is expanded into the model's fields (Resolved), which
//     are compared: a preset and its own sizes spelled out are one model.
func comparedSpec(s Spec) Spec {
	set := func(path string) string {
		if path == "" {
			return ""
		}
		return "(set)"
	}
	s.Threads = 0
	s.Data.Train, s.Data.Val = set(s.Data.Train), set(s.Data.Val)
	s.Checkpoint.Dir = set(s.Checkpoint.Dir)
	s.Log.TensorBoard = ""
	s.Model.Preset = ""
	return s
}

// sameDigest reports whether every rank of c has the SHA-256 prefix of b
// that this rank has: an all-reduce of the maximum of each 16-bit piece
// and of its negation, whose maximum is minus the minimum.
func sameDigest(ctx context.Context, c *comm.Communicator, b []byte) (bool, error) {
	sum := sha256.Sum256(b)
	v := make([]float32, 2*digestChunks)
	for i := range digestChunks {
		h := float32(binary.LittleEndian.Uint16(sum[2*i:]))
		v[i], v[digestChunks+i] = h, -h
	}
	if err := c.AllReduce(ctx, comm.F32(v), comm.Max); err != nil {
		return false, err
	}
	for i := range digestChunks {
		if v[i] != -v[digestChunks+i] {
			return false, nil
		}
	}
	return true, nil
}

// describeDiff names, on every rank alike, the first setting in which
// the lowest rank whose spec differs from rank 0's departs from it: rank 0
// broadcasts its spec, the ranks find the lowest differing rank with a
// minimum, and that rank broadcasts its own. Each step is decided by what
// every rank received, so all ranks run the same collectives. Should one
// fail, the message says only that the specs differ.
func describeDiff(ctx context.Context, c *comm.Communicator, mine []byte) string {
	const differ = "the ranks' job specs differ"
	first, err := broadcastBytes(ctx, c, mine, 0)
	if err != nil {
		return differ
	}
	// float32 holds every rank number below 2^24 exactly.
	low := []float32{float32(c.Size())}
	if !bytes.Equal(first, mine) {
		low[0] = float32(c.Rank())
	}
	if err := c.AllReduce(ctx, comm.F32(low), comm.Min); err != nil {
		return differ
	}
	r := int(low[0])
	if r <= 0 || r >= c.Size() {
		return differ
	}
	theirs, err := broadcastBytes(ctx, c, mine, r)
	if err != nil {
		return differ
	}
	key, v0, vr, ok := firstDiff(first, theirs)
	if !ok {
		return fmt.Sprintf("%s (rank %d's from rank 0's)", differ, r)
	}
	return fmt.Sprintf("%s is %s on rank %d but %s on rank 0", key, vr, r, v0)
}

// broadcastBytes gives every rank root's b: its length, then its bytes as
// 16-bit words (a broadcast copies bits and does no arithmetic). A length
// above maxSpecBytes is refused on every rank alike.
func broadcastBytes(ctx context.Context, c *comm.Communicator, b []byte, root int) ([]byte, error) {
	n := []float32{float32(len(b))}
	if err := c.Broadcast(ctx, comm.F32(n), root); err != nil {
		return nil, err
	}
	size := int(n[0])
	if size < 0 || size > maxSpecBytes {
		return nil, fmt.Errorf("rank %d's spec: %d bytes, more than %d", root, size, maxSpecBytes)
	}
	buf := make([]byte, size+size%2)
	words := make([]uint16, len(buf)/2)
	if c.Rank() == root {
		copy(buf, b)
		for i := range words {
			words[i] = binary.LittleEndian.Uint16(buf[2*i:])
		}
	}
	if err := c.Broadcast(ctx, comm.BF16(words), root); err != nil {
		return nil, err
	}
	for i, w := range words {
		binary.LittleEndian.PutUint16(buf[2*i:], w)
	}
	return buf[:size], nil
}

// specLeaf is one setting of an encoded spec: its dotted key (as the job
// file names it, "batch.micro_batch") and its JSON value.
type specLeaf struct{ key, value string }

// firstDiff is the first setting, in a's order, whose value differs
// between the encoded specs a and b ("absent" where one lacks it, as a
// spec of another gtrain version may), then any setting only b has.
func firstDiff(a, b []byte) (key, va, vb string, ok bool) {
	la, err := specLeaves(a)
	if err != nil {
		return "", "", "", false
	}
	lb, err := specLeaves(b)
	if err != nil {
		return "", "", "", false
	}
	inB := make(map[string]string, len(lb))
	for _, l := range lb {
		inB[l.key] = l.value
	}
	inA := make(map[string]bool, len(la))
	for _, l := range la {
		inA[l.key] = true
		if v, found := inB[l.key]; !found || v != l.value {
			return l.key, shortValue(l.value), shortValue(v), true
		}
	}
	for _, l := range lb {
		if !inA[l.key] {
			return l.key, shortValue(""), shortValue(l.value), true
		}
	}
	return "", "", "", false
}

// shortValue is a JSON value for a one-line message: "absent" for none,
// long ones (a list of pipeline layers) cut.
func shortValue(v string) string {
	const max = 60
	switch {
	case v == "":
		return "absent"
	case len(v) > max:
		return strings.ToValidUTF8(v[:max], "") + "…"
	}
	return v
}

// specLeaves lists the settings of an encoded spec in its order: the
// values of its objects' keys, nested keys joined with dots; lists and
// scalars are values.
func specLeaves(b []byte) ([]specLeaf, error) {
	var out []specLeaf
	err := addLeaves("", b, &out)
	return out, err
}

// addLeaves appends the leaves of raw, the value of key, to out.
func addLeaves(key string, raw []byte, out *[]specLeaf) error {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '{' {
		*out = append(*out, specLeaf{key, string(raw)})
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if _, err := dec.Token(); err != nil {
		return err
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		name, _ := tok.(string)
		if key != "" {
			name = key + "." + name
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return err
		}
		if err := addLeaves(name, v, out); err != nil {
			return err
		}
	}
	return nil
}
