package ckpt

import (
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Format is the version of the checkpoint format this package writes and
// reads (the manifest's "format").
const Format = 1

// ManifestName is the name of the manifest in a step directory.
const ManifestName = "manifest.json"

// OptimizerPrefix starts the names of optimizer-state tensors, e.g.
// "optimizer.exp_avg.transformer.wte.weight"; every other tensor is a model
// parameter.
const OptimizerPrefix = "optimizer."

// StepDirName is the name of the directory of step's checkpoint.
func StepDirName(step int64) string { return fmt.Sprintf("step-%08d", step) }

// ParseStepDir returns the step of a directory named by StepDirName.
func ParseStepDir(name string) (int64, bool) {
	digits, ok := strings.CutPrefix(name, "step-")
	if !ok {
		return 0, false
	}
	step, err := strconv.ParseInt(digits, 10, 64)
	// Only the canonical spelling: "step-1" and "step-00000001" must not
	// both be step 1.
	if err != nil || step < 0 || StepDirName(step) != name {
		return 0, false
	}
	return step, true
}

// RankFileName is the name of rank's file in a step directory.
func RankFileName(rank int) string { return fmt.Sprintf("rank-%05d.safetensors", rank) }

// maxWorld bounds the world size a manifest may claim (which also keeps
// dp × tp × pp from overflowing).
const maxWorld = 1 << 20

// Layout is how the ranks of the job that wrote a checkpoint divided the
// model: World = DP × TP × PP ranks, and the ZeRO stage of the optimizer.
type Layout struct {
	World     int `json:"world"`
	DP        int `json:"dp"`
	TP        int `json:"tp"`
	PP        int `json:"pp"`
	ZeroStage int `json:"zero_stage"`
}

// File is one rank's file of a checkpoint, as WriteShard returns it and the
// manifest lists it.
type File struct {
	Name   string `json:"name"`
	Rank   int    `json:"rank"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"` // lowercase hex
}

// ShardRef is where one shard of a tensor is: which file, and which
// elements it holds. Without a Part (DP and ZeRO layouts, and every
// checkpoint before tensor parallelism) they are elements [Offset,
// Offset+Len) of the flattened full tensor; with one, of the flattened
// tensor-parallel part (see PartRef).
type ShardRef struct {
	File   string  `json:"file"`
	Offset int     `json:"offset"`
	Len    int     `json:"len"`
	Part   PartRef `json:"part,omitzero"`
}

// PartRef is a tensor-parallel part of a full tensor, as
// engine/tensorpar.Part cuts it: Split is "rows", "columns" or
// "qkv-heads" (tensorpar.Split's names), Rank of Size the part, Heads the
// attention heads a qkv-heads split needs (0 for the others). A whole
// tensor has no PartRef (the zero value): a replicated tensor or a part of
// one is listed without one.
type PartRef struct {
	Split string `json:"split"`
	Rank  int    `json:"rank"`
	Size  int    `json:"size"`
	Heads int    `json:"heads,omitempty"`
}

// TensorIndex is one tensor of a checkpoint: its full shape, and its shards
// in offset order.
type TensorIndex struct {
	Name   string     `json:"name"`
	Shape  []int      `json:"shape"`
	DType  string     `json:"dtype"`
	Shards []ShardRef `json:"shards"`
}

// Manifest describes a committed checkpoint; it is manifest.json.
type Manifest struct {
	Format  int             `json:"format"`
	Step    int64           `json:"step"`
	Created time.Time       `json:"created"`
	Job     json.RawMessage `json:"job,omitempty"` // the job spec (JSON)
	Layout  Layout          `json:"layout"`
	Files   []File          `json:"files"`
	Tensors []TensorIndex   `json:"tensors"` // sorted by name
}

// Bytes is the total size of the checkpoint's files.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Bytes
	}
	return n
}

// validate checks everything a manifest says about itself, without looking
// at the files.
func (m *Manifest) validate() error {
	if m.Format != Format {
		return fmt.Errorf("format %d, this gtrain reads format %d (written by another version?)", m.Format, Format)
	}
	if m.Step < 0 {
		return fmt.Errorf("negative step %d", m.Step)
	}
	if err := m.Layout.validate(); err != nil {
		return err
	}
	if err := validateFiles(m.Files, m.Layout.World); err != nil {
		return err
	}
	return validateTensors(m.Tensors, m.Files)
}

func (l Layout) validate() error {
	switch {
	case l.World < 1 || l.DP < 1 || l.TP < 1 || l.PP < 1:
		return fmt.Errorf("layout %+v: world, dp, tp and pp must be at least 1", l)
	case l.World > maxWorld || l.DP > l.World || l.TP > l.World || l.PP > l.World:
		return fmt.Errorf("layout %+v: more than %d ranks, or a degree larger than the world", l, maxWorld)
	case l.DP*l.TP*l.PP != l.World:
		return fmt.Errorf("layout %+v: dp × tp × pp = %d, not world %d", l, l.DP*l.TP*l.PP, l.World)
	case l.ZeroStage < 0 || l.ZeroStage > 3:
		return fmt.Errorf("layout %+v: zero_stage must be 0 to 3", l)
	}
	return nil
}

// validateFiles checks the file list: plain, unique names (a manifest must
// not point outside its directory), unique ranks within the world, sizes
// and checksums well formed.
func validateFiles(files []File, world int) error {
	if len(files) == 0 {
		return errors.New("no files")
	}
	names, ranks := map[string]bool{}, map[int]bool{}
	for _, f := range files {
		if !plainName(f.Name) || f.Name == ManifestName || isTemp(f.Name) {
			return fmt.Errorf("file name %q: want a plain file name in the step directory", f.Name)
		}
		if names[f.Name] || ranks[f.Rank] {
			return fmt.Errorf("file %s (rank %d): a name or rank listed twice", f.Name, f.Rank)
		}
		names[f.Name], ranks[f.Rank] = true, true
		if f.Rank < 0 || f.Rank >= world {
			return fmt.Errorf("file %s: rank %d outside the world of %d", f.Name, f.Rank, world)
		}
		if f.Bytes < 8 {
			return fmt.Errorf("file %s: size %d, a safetensors file has at least 8 bytes", f.Name, f.Bytes)
		}
		if b, err := hex.DecodeString(f.SHA256); err != nil || len(b) != 32 || strings.ToLower(f.SHA256) != f.SHA256 {
			return fmt.Errorf("file %s: sha256 %q is not 64 lowercase hex digits", f.Name, f.SHA256)
		}
	}
	return nil
}

// plainName reports whether name is a file name without a directory part.
func plainName(name string) bool {
	return name != "" && name != "." && name != ".." && filepath.Base(name) == name && !strings.ContainsAny(name, `/\`)
}

// validateTensors checks the tensor index: unique names, F32, sane shapes,
// shards in listed files that tile each tensor exactly.
func validateTensors(tensors []TensorIndex, files []File) error {
	known := map[string]bool{}
	for _, f := range files {
		known[f.Name] = true
	}
	seen := map[string]bool{}
	for _, t := range tensors {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("tensor %q: empty or listed twice", t.Name)
		}
		seen[t.Name] = true
		if t.DType != "F32" {
			return fmt.Errorf("tensor %q: dtype %q, want F32", t.Name, t.DType)
		}
		numel, err := numelOf(t.Shape, math.MaxInt64/8)
		if err != nil {
			return fmt.Errorf("tensor %q: %w", t.Name, err)
		}
		for _, s := range t.Shards {
			if !known[s.File] {
				return fmt.Errorf("tensor %q: shard in %q, which is not a listed file", t.Name, s.File)
			}
		}
		if err := checkTensorShards(t.Shards, t.Shape, numel); err != nil {
			return fmt.Errorf("tensor %q of shape %v: %w", t.Name, t.Shape, err)
		}
	}
	return nil
}

// checkShards checks that shards cover elements [0, numel) exactly once.
// It sorts them by offset.
func checkShards(shards []ShardRef, numel int) error {
	sort.SliceStable(shards, func(i, j int) bool {
		return shards[i].Offset < shards[j].Offset || shards[i].Offset == shards[j].Offset && shards[i].Len < shards[j].Len
	})
	at := 0
	for _, s := range shards {
		switch {
		case s.Len < 0 || s.Offset < 0 || s.Offset > numel || s.Len > numel-s.Offset:
			return fmt.Errorf("shard [%d, +%d) in %s is outside its %d elements", s.Offset, s.Len, s.File, numel)
		case s.Offset < at:
			return fmt.Errorf("shards overlap at element %d (%s)", s.Offset, s.File)
		case s.Offset > at:
			return fmt.Errorf("no shard holds elements [%d, %d)", at, s.Offset)
		}
		at += s.Len
	}
	if at != numel {
		return fmt.Errorf("no shard holds elements [%d, %d)", at, numel)
	}
	return nil
}
