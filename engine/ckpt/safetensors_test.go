package ckpt

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"
)

// stFile is a safetensors file with header js (unpadded) and data bytes.
func stFile(js string, data int) []byte {
	b := binary.LittleEndian.AppendUint64(nil, uint64(len(js)))
	b = append(b, js...)
	return append(b, make([]byte, data)...)
}

// TestReadHeader accepts what the reference implementation accepts and
// refuses the rest, each with a reason.
func TestReadHeader(t *testing.T) {
	good := []struct {
		name string
		file []byte
	}{
		{"empty", stFile(`{}`, 0)},
		{"metadata_only", stFile(`{"__metadata__":{"format":"pt"}}`, 0)},
		{"two", stFile(`{"b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 12)},
		{"scalar_and_empty", stFile(`{"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},"e":{"dtype":"F16","shape":[0,4],"data_offsets":[8,8]}}`, 8)},
		{"padded", stFile(`{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}}    `, 3)},
	}
	for _, tc := range good {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := ReadHeader(bytes.NewReader(tc.file), int64(len(tc.file))); err != nil {
				t.Errorf("ReadHeader: %v", err)
			}
		})
	}
	h, _ := ReadHeader(bytes.NewReader(good[2].file), int64(len(good[2].file)))
	if len(h.Entries) != 2 || h.Entries[0].Name != "a" || h.Entries[1].Numel() != 2 || h.DataStart != 8+int64(len(good[2].file)-8-12) {
		t.Errorf("two: entries %+v, data at %d", h.Entries, h.DataStart)
	}
	bad := []struct {
		name, reason string
		file         []byte
	}{
		{"short", "too short", []byte{1, 2, 3}},
		{"huge_length", "does not fit", binary.LittleEndian.AppendUint64(nil, 1<<62)},
		{"length_past_end", "does not fit", append(binary.LittleEndian.AppendUint64(nil, 10), "{}"...)},
		{"not_object", "not a JSON object", stFile(`[]`, 0)},
		{"bad_json", "header", stFile(`{"a":`, 0)},
		{"unknown_dtype", `unknown dtype "F128"`, stFile(`{"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}}`, 16)},
		{"size_mismatch", "more than 2 elements of F32 in a 8-byte data section", stFile(`{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}`, 8)},
		{"past_data", "outside the 4-byte data section", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}`, 4)},
		{"reversed", "outside", stFile(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}`, 4)},
		{"wrong_size", "is 8 bytes, data_offsets [0, 4] hold 4", stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}`, 8)},
		{"negative_dim", "negative dimension", stFile(`{"a":{"dtype":"U8","shape":[-1,-4],"data_offsets":[0,4]}}`, 4)},
		{"overflow", "more than", stFile(`{"a":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}}`, 8)},
		{"overlap", "a gap or an overlap", stFile(`{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}`, 6)},
		{"gap", "a gap or an overlap", stFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}}`, 6)},
		{"trailing_data", "end at byte 2 of the 6-byte", stFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}`, 6)},
		{"offsets_arity", "data_offsets has 3", stFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2,2]}}`, 2)},
		{"metadata_not_strings", "__metadata__", stFile(`{"__metadata__":{"a":1}}`, 0)},
		{"offsets_not_ints", "header", stFile(`{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,1e30]}}`, 2)},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadHeader(bytes.NewReader(tc.file), int64(len(tc.file)))
			if err == nil || !strings.HasPrefix(err.Error(), "safetensors: ") || !strings.Contains(err.Error(), tc.reason) {
				t.Errorf("ReadHeader = %v, want an error saying %q", err, tc.reason)
			}
		})
	}
}

// TestEncodeHeader: the written header is 8-byte aligned and reads back.
func TestEncodeHeader(t *testing.T) {
	entries := []Entry{{Name: "x", DType: "F32", Shape: []int{3}}, {Name: "y", DType: "BF16", Shape: []int{2, 1}}}
	dataLen := layoutEntries(entries, func(i int) int { return []int{3, 2}[i] })
	hdr, err := encodeHeader(entries, map[string]string{"k": "v"})
	if err != nil || len(hdr)%8 != 0 || dataLen != 16 {
		t.Fatalf("encodeHeader: %d bytes, data %d, %v", len(hdr), dataLen, err)
	}
	file := append(hdr, make([]byte, dataLen)...)
	h, err := ReadHeader(bytes.NewReader(file), int64(len(file)))
	if err != nil || len(h.Entries) != 2 || h.Metadata["k"] != "v" || h.Entries[1].Begin != 12 {
		t.Errorf("read back: %+v, %v", h, err)
	}
	if _, err := encodeHeader([]Entry{{Name: metadataKey, DType: "F32"}}, nil); err == nil {
		t.Error("a tensor named __metadata__ was encoded")
	}
}

// FuzzReadHeader: whatever the bytes, ReadHeader neither panics nor
// allocates beyond the input, and what it accepts is self-consistent.
func FuzzReadHeader(f *testing.F) {
	f.Add(stFile(`{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"__metadata__":{"x":"y"}}`, 8))
	f.Add(stFile(`{"b":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]},"c":{"dtype":"U8","shape":[],"data_offsets":[4,5]}}`, 5))
	f.Add(stFile(`{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,0]}}`, 0))
	f.Add(stFile(`{"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,8]}}`, 8))
	f.Add(binary.LittleEndian.AppendUint64(nil, 1<<40))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := ReadHeader(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			return
		}
		at := h.DataStart
		for _, e := range h.Entries {
			if h.DataStart+e.Begin != at || e.End < e.Begin || int64(e.Numel())*dtypeSizes[e.DType] != e.End-e.Begin {
				t.Fatalf("accepted an inconsistent entry %+v (data at %d)", e, h.DataStart)
			}
			at = h.DataStart + e.End
		}
		if at != int64(len(data)) {
			t.Fatalf("accepted entries ending at %d of %d bytes", at, len(data))
		}
	})
}
