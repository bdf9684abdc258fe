package data

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gtrain/gtrain/internal/atomicfile"
	"github.com/gtrain/gtrain/internal/userfile"
)

// Meta describes a prepared data directory (its meta.json): which tokenizer
// made train.bin and val.bin, and how many tokens each holds.
type Meta struct {
	Tokenizer   string   `json:"tokenizer"`  // "bytes" for the built-in byte-level tokenizer
	VocabSize   int      `json:"vocab_size"` // every id in the files is below it
	EOT         int      `json:"eot"`        // the id put before each document
	TrainTokens int64    `json:"train_tokens"`
	ValTokens   int64    `json:"val_tokens"`
	Sources     []string `json:"sources"` // input files, in order, or "synthetic:..."
}

// Conventional names of the files of a prepared data directory.
const (
	TrainFile = "train.bin"
	ValFile   = "val.bin"
	MetaFile  = "meta.json"
)

// WriteMeta writes m as the JSON file path, atomically. Write it after the
// token files: a directory whose meta.json is there and agrees with them is
// complete. It refuses a meta.json over MaxMetaSize, which ReadMeta would
// refuse.
func WriteMeta(path string, m Meta) error { return writeMeta(path, m, MaxMetaSize) }

func writeMeta(path string, m Meta, limit int) error {
	if m.Sources == nil {
		m.Sources = []string{}
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return fmt.Errorf("data: write %s: %w", path, err)
	}
	if len(b) >= limit { // with its newline, over the limit
		return fmt.Errorf("data: write %s: %s of JSON for %d sources, over the %s a meta.json may have: prepare fewer files at once",
			path, userfile.Size(int64(len(b))+1), len(m.Sources), userfile.Size(int64(limit)))
	}
	return writeAtomic(path, func(w io.Writer) error {
		_, err := w.Write(append(b, '\n'))
		return err
	})
}

// StartDir makes the data directory dir ready to be rewritten: it refuses,
// before anything changes, a train.bin, val.bin or meta.json that is not a
// regular file (or a symbolic link to one, which is written through), and
// removes meta.json (the file its link points to), so that an old one
// cannot vouch for token files while they are being rewritten.
func StartDir(dir string) error {
	var meta string
	for _, name := range []string{TrainFile, ValFile, MetaFile} {
		target, err := atomicfile.Resolve(filepath.Join(dir, name))
		if err != nil {
			return fmt.Errorf("data: %w", err)
		}
		meta = target
	}
	if err := os.Remove(meta); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("data: %w", err)
	}
	return nil
}

// MaxMetaSize bounds a meta.json, so that a data directory whose meta.json
// is /dev/zero or a huge file is refused instead of read without end. The
// file lists its sources, up to 2^20 input files for one data prepare:
// 256 bytes a path, more than real ones take, makes 256 MiB, and WriteMeta
// refuses to write more.
const MaxMetaSize = 256 << 20

// ReadMeta reads and checks the meta.json file path: a regular file (a FIFO
// or device is refused without blocking) of at most MaxMetaSize bytes.
func ReadMeta(path string) (Meta, error) {
	var m Meta
	b, err := userfile.ReadRegular(path, MaxMetaSize)
	if err != nil {
		return m, fmt.Errorf("data: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("data: %s: not a data meta.json: %w; prepare the data again", path, err)
	}
	if err := m.check(); err != nil {
		return m, fmt.Errorf("data: %s: %w; prepare the data again", path, err)
	}
	return m, nil
}

// check reports the first field that cannot be right.
func (m Meta) check() error {
	switch {
	case m.Tokenizer == "":
		return fmt.Errorf("no tokenizer")
	case m.VocabSize <= 0 || m.VocabSize > 1<<16:
		return fmt.Errorf("vocab_size %d: want 1 to 65536 (ids are uint16)", m.VocabSize)
	case m.EOT < 0 || m.EOT >= m.VocabSize:
		return fmt.Errorf("eot %d: want an id below vocab_size %d", m.EOT, m.VocabSize)
	case m.TrainTokens < 0 || m.ValTokens < 0:
		return fmt.Errorf("train_tokens %d, val_tokens %d: must not be negative", m.TrainTokens, m.ValTokens)
	}
	return nil
}
