package data

import (
	"slices"
	"testing"
)

func TestEncodeDecode(t *testing.T) {
	tests := []struct {
		name string
		doc  string
		want []uint16
	}{
		{"empty document is EOT", "", []uint16{EOT}},
		{"ascii", "hi\n", []uint16{EOT, 'h', 'i', '\n'}},
		{"utf-8 bytes", "é", []uint16{EOT, 0xc3, 0xa9}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := EncodeBytes([]byte(tt.doc))
			if !slices.Equal(got, tt.want) {
				t.Fatalf("EncodeBytes(%q) = %v, want %v", tt.doc, got, tt.want)
			}
			if dec := Decode(got); dec != EOTMarker+tt.doc {
				t.Errorf("Decode = %q, want %q", dec, EOTMarker+tt.doc)
			}
		})
	}
	if got := Decode([]uint16{'a', 300, 'b'}); got != "a\uFFFDb" {
		t.Errorf("Decode of an id outside the vocabulary = %q", got)
	}
}

// FuzzEncodeBytes: any document encodes to EOT plus its bytes, and decodes
// back.
func FuzzEncodeBytes(f *testing.F) {
	f.Add([]byte("hello"))
	f.Add([]byte{0, 255})
	f.Fuzz(func(t *testing.T, doc []byte) {
		toks := EncodeBytes(doc)
		if len(toks) != len(doc)+1 || toks[0] != EOT {
			t.Fatalf("EncodeBytes(%q) = %v", doc, toks)
		}
		if err := NewTokens(toks).CheckVocab(ByteVocabSize); err != nil {
			t.Fatal(err)
		}
		if got := Decode(toks[1:]); got != string(doc) {
			t.Fatalf("Decode(EncodeBytes(%q)) = %q", doc, got)
		}
	})
}
