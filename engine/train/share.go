package train

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
)

// fileWords is one rank's checkpoint file as it travels to rank 0: a
// written flag, its size and its SHA-256, in 16-bit words. They go through
// an all-gather, which copies bytes and does no arithmetic, so the words
// arrive bit for bit whatever the element type says.
const fileWords = 1 + 4 + 16

// shareFiles gives every rank the File each rank wrote (werr is this
// rank's write error). It fails on every rank if any rank failed to write.
func (t *Trainer) shareFiles(f ckpt.File, werr error) ([]ckpt.File, error) {
	if t.env.Comm == nil {
		return []ckpt.File{f}, werr
	}
	mine := make([]uint16, fileWords)
	b := make([]byte, 2*fileWords)
	if werr == nil {
		sum, err := hex.DecodeString(f.SHA256)
		if err != nil || len(sum) != 32 {
			werr = fmt.Errorf("rank %d: bad checksum %q", t.env.Rank, f.SHA256)
		} else {
			b[0] = 1
			binary.LittleEndian.PutUint64(b[2:], uint64(f.Bytes))
			copy(b[10:], sum)
		}
	}
	for i := range mine {
		mine[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	all := make([]uint16, fileWords*t.env.World)
	if err := t.env.Comm.AllGather(t.ctx(), comm.BF16(mine), comm.BF16(all)); err != nil {
		return nil, errors.Join(werr, err)
	}
	files := make([]ckpt.File, t.env.World)
	var failed []int
	for r := range files {
		w := all[r*fileWords : (r+1)*fileWords]
		for i, v := range w {
			binary.LittleEndian.PutUint16(b[2*i:], v)
		}
		if b[0] != 1 {
			failed = append(failed, r)
			continue
		}
		files[r] = ckpt.File{Name: ckpt.RankFileName(r), Rank: r, Bytes: int64(binary.LittleEndian.Uint64(b[2:])), SHA256: hex.EncodeToString(b[10:42])}
	}
	if werr != nil {
		return nil, werr
	}
	if len(failed) > 0 {
		return nil, fmt.Errorf("ranks %v could not write their files (see their logs)", failed)
	}
	return files, nil
}

// agree makes rank 0's outcome (err on rank 0) every rank's: rank 0
// broadcasts whether it succeeded; the others fail saying that rank 0
// failed to do what (e.g. "could not commit the checkpoint").
func (t *Trainer) agree(err error, what string) error {
	if t.env.Comm == nil {
		return err
	}
	ok := []float32{0}
	if err == nil {
		ok[0] = 1
	}
	if berr := t.env.Comm.Broadcast(t.ctx(), comm.F32(ok), 0); berr != nil {
		return errors.Join(err, berr)
	}
	if err == nil && ok[0] != 1 {
		return fmt.Errorf("rank 0 %s (see its log)", what)
	}
	return err
}
