// Package ckpt writes, verifies, reads and exports the built-in engine's
// checkpoints.
//
// A checkpoint is one directory per step under a root:
//
//	root/step-00000100/rank-00000.safetensors
//	root/step-00000100/rank-00001.safetensors
//	root/step-00000100/manifest.json
//
// Every rank writes its own file with WriteShard: a safetensors file holding
// that rank's part of the model parameters and of the optimizer state (names
// such as "transformer.h.0.attn.c_attn.weight" and
// "optimizer.exp_avg.transformer.h.0.attn.c_attn.weight"), each tensor
// possibly a shard (a contiguous run of elements of the flattened full
// tensor), plus the rank's opaque state (RNG, sampler position, ...). The
// header's "__metadata__" records, per tensor, the full shape and the shard's
// element offset ("gtrain.shards"), and the state ("gtrain.state"), so a
// rank file describes itself and is covered by its own checksum. A tensor a
// rank holds whole keeps its full shape in the file; a shard is stored 1-D.
//
// When every rank's file is on disk, rank 0 calls Commit, which builds the
// tensor index from the files' headers, checks that the shards of every
// tensor tile it exactly, and writes manifest.json last, atomically (temp
// file, fsync, rename, fsync of the directory): the job spec, the layout,
// each file's size and SHA-256 and the index. A step directory without a
// valid manifest, or whose files do not match their sizes and checksums, is
// not a checkpoint: Latest skips it with a warning and never loads it.
// Every file is written through a temporary name (".NAME.tmp-RANDOM") and
// renamed into place, so an interruption at any moment, SIGKILL included,
// leaves at worst an incomplete directory that is skipped, and the previous
// checkpoint still loads.
//
// A rank of a tensor-parallel layout writes its file with WriteParts: each
// tensor is a tensorpar.Part of the full tensor (rows, columns, or the
// q|k|v heads of c_attn), whole or a range of it (ZeRO over DP ranks), and
// "gtrain.parts" in the metadata names the part; the manifest's shard then
// carries a "part" and its offset and length count elements of the part.
// Replicated tensors are saved by TP rank 0 only, so every tensor is still
// saved once, and a file without parts is exactly what WriteShard writes.
// ReadRange, ReadPart and ReadPartRange assemble any piece of a full tensor
// (a ZeRO range, a part of any TP size, a range of such a part) from shards
// of any layout, and Export writes the same file whatever the layout.
//
// The safetensors format (also what Export writes, readable by the
// safetensors/PyTorch ecosystem): an 8-byte little-endian header length N, N
// bytes of JSON {"NAME": {"dtype": "F32", "shape": [...], "data_offsets":
// [begin, end]}, "__metadata__": {...}} padded with spaces to a multiple of
// 8, then the little-endian tensor data, tensors back to back.
package ckpt
