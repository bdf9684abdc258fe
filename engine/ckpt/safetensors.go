package ckpt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"sort"
)

// MaxHeaderBytes bounds the JSON header of a safetensors file, as the
// reference implementation does (100 MB): a corrupt length must not make
// the reader allocate gigabytes.
const MaxHeaderBytes = 100 << 20

// metadataKey is the reserved header key of the string→string metadata.
const metadataKey = "__metadata__"

// dtypeSizes are the element sizes of the safetensors dtypes.
var dtypeSizes = map[string]int64{
	"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1,
	"I16": 2, "U16": 2, "F16": 2, "BF16": 2,
	"I32": 4, "U32": 4, "F32": 4,
	"I64": 8, "U64": 8, "F64": 8,
}

// Entry is one tensor of a safetensors file as its header describes it.
type Entry struct {
	Name  string
	DType string
	Shape []int
	// Begin and End are byte offsets into the data section, which starts at
	// Header.DataStart in the file.
	Begin, End int64
}

// Numel is the number of elements of the entry.
func (e Entry) Numel() int { return int((e.End - e.Begin) / dtypeSizes[e.DType]) }

// Header is the decoded, validated header of a safetensors file.
type Header struct {
	Entries   []Entry // in data order
	Metadata  map[string]string
	DataStart int64 // file offset of the data section: 8 + header length
}

// Entry returns the entry called name.
func (h *Header) Entry(name string) (Entry, bool) {
	for _, e := range h.Entries {
		if e.Name == name {
			return e, true
		}
	}
	return Entry{}, false
}

// rawEntry is an entry as JSON.
type rawEntry struct {
	DType       string  `json:"dtype"`
	Shape       []int   `json:"shape"`
	DataOffsets []int64 `json:"data_offsets"`
}

// ReadHeader reads and validates the header of the safetensors file r of
// size bytes. It accepts only what the reference implementation accepts: a
// header length within the file, a JSON object, known dtypes, data offsets
// consistent with dtype × shape that tile the data section exactly (no gap,
// no overlap, nothing after). It never allocates more than the header's own
// size plus a bounded amount per entry, whatever the input.
func ReadHeader(r io.ReaderAt, size int64) (*Header, error) {
	if size < 8 {
		return nil, fmt.Errorf("safetensors: file is %d bytes, too short for the 8-byte header length", size)
	}
	var lenBuf [8]byte
	if _, err := r.ReadAt(lenBuf[:], 0); err != nil {
		return nil, fmt.Errorf("safetensors: read header length: %w", err)
	}
	n := binary.LittleEndian.Uint64(lenBuf[:])
	if n > uint64(size-8) || n > MaxHeaderBytes {
		return nil, fmt.Errorf("safetensors: header length %d does not fit a %d-byte file (at most %d)", n, size, min(size-8, MaxHeaderBytes))
	}
	buf := make([]byte, n)
	if _, err := r.ReadAt(buf, 8); err != nil {
		return nil, fmt.Errorf("safetensors: read %d-byte header: %w", n, err)
	}
	h, err := decodeHeader(buf, size-8-int64(n))
	if err != nil {
		return nil, fmt.Errorf("safetensors: header: %w", err)
	}
	h.DataStart = 8 + int64(n)
	return h, nil
}

// decodeHeader parses the JSON header of a file whose data section is
// dataLen bytes.
func decodeHeader(buf []byte, dataLen int64) (*Header, error) {
	if len(buf) == 0 || buf[0] != '{' {
		return nil, errors.New("not a JSON object")
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(buf, &raw); err != nil {
		return nil, err
	}
	h := &Header{Entries: make([]Entry, 0, len(raw))}
	for name, msg := range raw {
		if name == metadataKey {
			if err := json.Unmarshal(msg, &h.Metadata); err != nil {
				return nil, fmt.Errorf("%s: want an object of strings: %w", metadataKey, err)
			}
			continue
		}
		e, err := decodeEntry(name, msg, dataLen)
		if err != nil {
			return nil, fmt.Errorf("tensor %q: %w", name, err)
		}
		h.Entries = append(h.Entries, e)
	}
	if err := checkTiling(h.Entries, dataLen); err != nil {
		return nil, err
	}
	return h, nil
}

// decodeEntry parses and checks one tensor's entry.
func decodeEntry(name string, msg json.RawMessage, dataLen int64) (Entry, error) {
	var re rawEntry
	if err := json.Unmarshal(msg, &re); err != nil {
		return Entry{}, err
	}
	size, ok := dtypeSizes[re.DType]
	if !ok {
		return Entry{}, fmt.Errorf("unknown dtype %q", re.DType)
	}
	if len(re.DataOffsets) != 2 {
		return Entry{}, fmt.Errorf("data_offsets has %d numbers, want 2", len(re.DataOffsets))
	}
	begin, end := re.DataOffsets[0], re.DataOffsets[1]
	if begin < 0 || end < begin || end > dataLen {
		return Entry{}, fmt.Errorf("data_offsets [%d, %d] outside the %d-byte data section", begin, end, dataLen)
	}
	numel, err := numelOf(re.Shape, dataLen/size)
	if err != nil {
		return Entry{}, fmt.Errorf("%w of %s in a %d-byte data section", err, re.DType, dataLen)
	}
	if int64(numel)*size != end-begin {
		return Entry{}, fmt.Errorf("shape %v of %s is %d bytes, data_offsets [%d, %d] hold %d", re.Shape, re.DType, int64(numel)*size, begin, end, end-begin)
	}
	return Entry{Name: name, DType: re.DType, Shape: re.Shape, Begin: begin, End: end}, nil
}

// numelOf is the number of elements of shape, or an error when a dimension
// is negative or the product exceeds limit.
func numelOf(shape []int, limit int64) (int, error) {
	for _, d := range shape {
		if d < 0 {
			return 0, fmt.Errorf("negative dimension in shape %v", shape)
		}
		if d == 0 {
			return 0, nil
		}
	}
	n := int64(1)
	for _, d := range shape {
		if int64(d) > limit/n {
			return 0, fmt.Errorf("shape %v has more than %d elements", shape, limit)
		}
		n *= int64(d)
	}
	return int(n), nil
}

// checkTiling sorts entries into data order and checks that they cover the
// data section back to back.
func checkTiling(entries []Entry, dataLen int64) error {
	sort.Slice(entries, func(i, j int) bool {
		a, b := entries[i], entries[j]
		return a.Begin < b.Begin || a.Begin == b.Begin && (a.End < b.End || a.End == b.End && a.Name < b.Name)
	})
	var at int64
	for _, e := range entries {
		if e.Begin != at {
			return fmt.Errorf("tensor %q starts at byte %d of the data, want %d (a gap or an overlap)", e.Name, e.Begin, at)
		}
		at = e.End
	}
	if at != dataLen {
		return fmt.Errorf("tensors end at byte %d of the %d-byte data section", at, dataLen)
	}
	return nil
}

// encodeHeader is the 8-byte length and the space-padded JSON header of a
// file holding entries, in order, back to back.
func encodeHeader(entries []Entry, meta map[string]string) ([]byte, error) {
	obj := make(map[string]any, len(entries)+1)
	for _, e := range entries {
		if e.Name == metadataKey {
			return nil, fmt.Errorf("safetensors: %q is reserved, not a tensor name", metadataKey)
		}
		shape := e.Shape
		if shape == nil {
			shape = []int{}
		}
		obj[e.Name] = rawEntry{DType: e.DType, Shape: shape, DataOffsets: []int64{e.Begin, e.End}}
	}
	if len(meta) > 0 {
		obj[metadataKey] = meta
	}
	js, err := json.Marshal(obj)
	if err != nil {
		return nil, fmt.Errorf("safetensors: encode header: %w", err)
	}
	if len(js) > MaxHeaderBytes {
		return nil, fmt.Errorf("safetensors: header is %d bytes, more than %d", len(js), MaxHeaderBytes)
	}
	// Pad so the data starts 8-byte aligned, as the reference writer does.
	pad := (8 - len(js)%8) % 8
	out := make([]byte, 8, 8+len(js)+pad)
	binary.LittleEndian.PutUint64(out, uint64(len(js)+pad))
	out = append(out, js...)
	return append(out, bytes.Repeat([]byte{' '}, pad)...), nil
}

// layoutEntries gives each entry its byte range, back to back from 0, and
// returns the size of the data section.
func layoutEntries(entries []Entry, numel func(i int) int) int64 {
	var at int64
	for i := range entries {
		n := int64(numel(i)) * dtypeSizes[entries[i].DType]
		entries[i].Begin, entries[i].End = at, at+n
		at += n
	}
	return at
}

// f32Bytes is the little-endian encoding of src, appended to dst.
func f32Bytes(dst []byte, src []float32) []byte {
	for _, f := range src {
		dst = binary.LittleEndian.AppendUint32(dst, math.Float32bits(f))
	}
	return dst
}
