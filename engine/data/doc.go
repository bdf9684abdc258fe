// Package data is the built-in engine's training data: token files in
// nanoGPT's .bin layout (a flat array of little-endian uint16 token ids, no
// header), memory-mapped read-only; a seeded, resumable, distributed sampler
// of random windows and a sequential evaluation set; gtrain's byte-level
// tokenizer (vocabulary 257, EOT = 256) and GPT-2's byte-level BPE
// (tiktoken's gpt2 encoding, ranks built in; vocabulary 50257), with the
// vocab.json and merges.txt Hugging Face's GPT2Tokenizer reads; and a
// synthetic corpus with learnable structure, so the engine's default job
// trains without a download. Prepare (gtrain data prepare) turns text
// files, or the synthetic corpus, into a data directory: train.bin,
// val.bin and meta.json, which names the tokenizer.
//
// Files are written atomically (a temporary file in the same directory,
// fsync, rename): an interrupted writer never leaves a truncated .bin behind
// that looks valid.
package data
