package ckpt

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"unicode/utf8"
)

// Tensor is a tensor, or a shard of one, as a rank holds it: Data are the
// elements [Offset, Offset+len(Data)) of the flattened (row-major) full
// tensor of shape Shape.
type Tensor struct {
	Name   string
	Shape  []int // the full tensor's shape
	Offset int   // element offset of Data in the full tensor
	Data   []float32
}

// The metadata keys of a rank file.
const (
	metaFormat      = "gtrain.format"
	metaStep        = "gtrain.step"
	metaRank        = "gtrain.rank"
	metaShards      = "gtrain.shards"       // JSON: name → shardMeta
	metaState       = "gtrain.state"        // the state, when it is UTF-8 (JSON is)
	metaStateBase64 = "gtrain.state.base64" // the state, when it is not
)

// shardMeta is a tensor's full shape and the element offset of the shard a
// rank file holds.
type shardMeta struct {
	Shape  []int `json:"shape"`
	Offset int   `json:"offset"`
}

// chunkElems is how many elements are converted and written at a time: the
// files are streamed, never built whole in memory.
const chunkElems = 256 << 10

// WriteShard writes rank's file of step's checkpoint under root: its tensors
// (parameters and optimizer state, each whole or a shard) and its opaque
// state (RNG, data-sampler position, ...; JSON is customary). The file goes
// to a temporary name in the step directory, is fsynced and renamed into
// place; its SHA-256 is computed while it is written. Ranks may call it
// concurrently, also from several hosts on a shared filesystem. The step is
// not a checkpoint until rank 0 passes every rank's File to Commit. Writing
// a step that already has a checkpoint (a run resumed from an older one)
// replaces it: its manifest is removed first, so until the new commit that
// step is no checkpoint, and Latest falls back to an older one. Do not
// rewrite the step a run resumed from.
func WriteShard(root string, step int64, rank int, tensors []Tensor, state []byte) (File, error) {
	name := RankFileName(rank)
	fail := func(err error) (File, error) {
		return File{}, fmt.Errorf("ckpt: write %s/%s: %w", StepDirName(step), name, err)
	}
	if step < 0 || rank < 0 {
		return fail(fmt.Errorf("step %d, rank %d: must not be negative", step, rank))
	}
	entries, meta, err := planShard(step, rank, tensors, state)
	if err != nil {
		return fail(err)
	}
	file, err := writeRankFile(root, step, rank, entries, meta, tensors)
	if err != nil {
		return fail(err)
	}
	return file, nil
}

// writeRankFile writes rank's file of step under root: a header of entries
// and meta, then the tensors' data in order, its SHA-256 computed while it
// is written.
func writeRankFile(root string, step int64, rank int, entries []Entry, meta map[string]string, tensors []Tensor) (File, error) {
	name := RankFileName(rank)
	header, err := encodeHeader(entries, meta)
	if err != nil {
		return File{}, err
	}
	dir := filepath.Join(root, StepDirName(step))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return File{}, err
	}
	// A run resumed from an older checkpoint rewrites later steps: the old
	// manifest must not vouch for a mix of old and new files.
	if err := removeIfExists(filepath.Join(dir, ManifestName)); err != nil {
		return File{}, err
	}
	file := File{Name: name, Rank: rank}
	err = writeAtomic(filepath.Join(dir, name), func(f io.Writer) error {
		h := sha256.New()
		cw := &countWriter{w: io.MultiWriter(f, h)}
		if err := writeShardData(cw, header, tensors); err != nil {
			return err
		}
		file.Bytes, file.SHA256 = cw.n, hex.EncodeToString(h.Sum(nil))
		return nil
	})
	return file, err
}

// planShard checks a rank's tensors and returns the entries and metadata of
// its file.
func planShard(step int64, rank int, tensors []Tensor, state []byte) ([]Entry, map[string]string, error) {
	entries := make([]Entry, len(tensors))
	shards := make(map[string]shardMeta, len(tensors))
	for i, t := range tensors {
		if t.Name == "" || t.Name == metadataKey {
			return nil, nil, fmt.Errorf("tensor %d: name %q is empty or reserved", i, t.Name)
		}
		if _, dup := shards[t.Name]; dup {
			return nil, nil, fmt.Errorf("tensor %q given twice", t.Name)
		}
		numel, err := numelOf(t.Shape, math.MaxInt64/8)
		if err != nil {
			return nil, nil, fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		if t.Offset < 0 || t.Offset > numel || len(t.Data) > numel-t.Offset {
			return nil, nil, fmt.Errorf("tensor %q: %d elements at offset %d do not fit shape %v", t.Name, len(t.Data), t.Offset, t.Shape)
		}
		// A whole tensor keeps its shape, so the file reads as it is in
		// safetensors tools; a shard is a 1-D run of the flattened tensor.
		shape := []int{len(t.Data)}
		if t.Offset == 0 && len(t.Data) == numel {
			shape = t.Shape
		}
		entries[i] = Entry{Name: t.Name, DType: "F32", Shape: shape}
		shards[t.Name] = shardMeta{Shape: t.Shape, Offset: t.Offset}
	}
	layoutEntries(entries, func(i int) int { return len(tensors[i].Data) })
	js, err := json.Marshal(shards)
	if err != nil {
		return nil, nil, err
	}
	meta := map[string]string{
		metaFormat: strconv.Itoa(Format),
		metaStep:   strconv.FormatInt(step, 10),
		metaRank:   strconv.Itoa(rank),
		metaShards: string(js),
	}
	// JSON strings hold UTF-8 only: other bytes would come back altered.
	if utf8.Valid(state) {
		meta[metaState] = string(state)
	} else {
		meta[metaStateBase64] = base64.StdEncoding.EncodeToString(state)
	}
	return entries, meta, nil
}

// writeShardData writes the header, then every tensor's data, a chunk at a
// time.
func writeShardData(w io.Writer, header []byte, tensors []Tensor) error {
	if _, err := w.Write(header); err != nil {
		return err
	}
	buf := make([]byte, 0, 4*chunkElems)
	for _, t := range tensors {
		for data := t.Data; len(data) > 0; {
			n := min(len(data), chunkElems)
			if _, err := w.Write(f32Bytes(buf[:0], data[:n])); err != nil {
				return err
			}
			data = data[n:]
		}
	}
	return nil
}

// countWriter counts the bytes written through it.
type countWriter struct {
	w io.Writer
	n int64
}

// Write writes p through and counts what was written.
func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// rankMeta is what a rank file's metadata says about it.
type rankMeta struct {
	step   int64
	rank   int
	shards map[string]shardMeta
	state  []byte
}

// readRankMeta decodes and checks the metadata of a rank file.
func readRankMeta(h *Header) (rankMeta, error) {
	var rm rankMeta
	md := h.Metadata
	if md[metaFormat] != strconv.Itoa(Format) {
		return rm, fmt.Errorf("metadata %s is %q, want %d: not a gtrain rank file of this format", metaFormat, md[metaFormat], Format)
	}
	var err1, err2, err3 error
	rm.step, err1 = strconv.ParseInt(md[metaStep], 10, 64)
	rm.rank, err2 = strconv.Atoi(md[metaRank])
	err3 = json.Unmarshal([]byte(md[metaShards]), &rm.shards)
	if err := errors.Join(err1, err2, err3); err != nil {
		return rm, fmt.Errorf("metadata: %w", err)
	}
	if s, ok := md[metaStateBase64]; ok {
		var err error
		if rm.state, err = base64.StdEncoding.DecodeString(s); err != nil {
			return rm, fmt.Errorf("metadata %s: %w", metaStateBase64, err)
		}
	} else {
		rm.state = []byte(md[metaState])
	}
	if len(rm.shards) != len(h.Entries) {
		return rm, fmt.Errorf("metadata %s describes %d tensors, the file holds %d", metaShards, len(rm.shards), len(h.Entries))
	}
	return rm, nil
}
