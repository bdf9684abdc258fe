package ckpt

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/engine/data"
	"github.com/gtrain/gtrain/internal/usage"
)

// Names of the files of a Hugging Face model directory that ExportHF
// writes.
const (
	HFWeightsFile = "model.safetensors"
	HFConfigFile  = "config.json"
)

// HFConfig is a config.json for transformers' GPT2LMHeadModel: GPT2Config's
// fields under their names, in the order save_pretrained writes them
// (sorted). The engine's GPT-2 is Hugging Face's: pre-LayerNorm blocks with
// ε 1e-5, tanh-GELU ("gelu_new"), attention scaled by 1/√head_size, an MLP
// of 4 × n_embd (n_inner null) and the output layer tied to the token
// embedding; it has no dropout, so the dropout rates are 0 (training on
// with transformers then adds none unless asked).
type HFConfig struct {
	ActivationFunction         string   `json:"activation_function"`
	Architectures              []string `json:"architectures"`
	AttnPdrop                  float64  `json:"attn_pdrop"`
	BosTokenID                 int      `json:"bos_token_id"`
	EmbdPdrop                  float64  `json:"embd_pdrop"`
	EosTokenID                 int      `json:"eos_token_id"`
	InitializerRange           float64  `json:"initializer_range"`
	LayerNormEpsilon           float64  `json:"layer_norm_epsilon"`
	ModelType                  string   `json:"model_type"`
	NCtx                       int      `json:"n_ctx"`
	NEmbd                      int      `json:"n_embd"`
	NHead                      int      `json:"n_head"`
	NInner                     *int     `json:"n_inner"`
	NLayer                     int      `json:"n_layer"`
	NPositions                 int      `json:"n_positions"`
	ReorderAndUpcastAttn       bool     `json:"reorder_and_upcast_attn"`
	ResidPdrop                 float64  `json:"resid_pdrop"`
	ScaleAttnByInverseLayerIdx bool     `json:"scale_attn_by_inverse_layer_idx"`
	ScaleAttnWeights           bool     `json:"scale_attn_weights"`
	SummaryActivation          *string  `json:"summary_activation"`
	SummaryFirstDropout        float64  `json:"summary_first_dropout"`
	SummaryProjToLabels        bool     `json:"summary_proj_to_labels"`
	SummaryType                string   `json:"summary_type"`
	SummaryUseProj             bool     `json:"summary_use_proj"`
	TieWordEmbeddings          bool     `json:"tie_word_embeddings"`
	TorchDtype                 string   `json:"torch_dtype"`
	UseCache                   bool     `json:"use_cache"`
	VocabSize                  int      `json:"vocab_size"`
}

// torchDtypes are the torch_dtype names of the export types.
var torchDtypes = map[comm.DType]string{0: "float32", comm.Float32: "float32", comm.BFloat16: "bfloat16", comm.Float16: "float16"}

// NewHFConfig is the config.json of a model of shape jm whose weights are
// exported as dtype; eot is the tokenizer's end-of-text id, GPT-2's
// bos_token_id and eos_token_id. The sequence-classification head's
// summary_* fields keep GPT2Config's defaults.
func NewHFConfig(jm JobModel, eot int, dtype comm.DType) HFConfig {
	return HFConfig{
		ActivationFunction: "gelu_new",
		Architectures:      []string{"GPT2LMHeadModel"},
		BosTokenID:         eot, EosTokenID: eot,
		InitializerRange: 0.02,
		LayerNormEpsilon: 1e-5,
		ModelType:        "gpt2",
		NCtx:             jm.Seq, NPositions: jm.Seq,
		NEmbd: jm.Embd, NHead: jm.Heads, NLayer: jm.Layers,
		ScaleAttnWeights:    true,
		SummaryFirstDropout: 0.1, SummaryProjToLabels: true, SummaryType: "cls_index", SummaryUseProj: true,
		TieWordEmbeddings: true,
		TorchDtype:        torchDtypes[dtype],
		UseCache:          true,
		VocabSize:         jm.Vocab,
	}
}

// HFExported is what ExportHF wrote.
type HFExported struct {
	Exported            // model.safetensors
	Dir       string    `json:"dir"`
	Files     []string  `json:"files"` // every file written, model.safetensors first
	Tokenizer string    `json:"tokenizer"`
	Config    *HFConfig `json:"config"`
}

// ExportHF exports the checkpoint r names (verified; a root's newest valid
// one) as a Hugging Face model directory r.To, as save_pretrained writes
// one: created if missing, its files replaced (atomically, and only
// regular files), other files left alone. It holds model.safetensors (the
// model parameters under GPT-2's names, r.DType), config.json and, for a
// run on GPT-2 BPE data, GPT2Tokenizer's vocab.json, merges.txt and
// tokenizer_config.json: GPT2LMHeadModel.from_pretrained(r.To) loads it.
// The run's tokenizer is its data's (see data.RunTokenizer); r.Warn hears
// of a guess.
func ExportHF(ctx context.Context, r ExportRequest) (HFExported, error) {
	if r.Optimizer {
		return HFExported{}, usage.Errorf("%s: --format hf exports the model only: drop --optimizer, or export safetensors", r.Op)
	}
	if fi, err := os.Stat(r.To); err == nil && !fi.IsDir() {
		return HFExported{}, usage.Errorf("%s: --out %s: not a directory: --format hf writes a model directory (config.json, model.safetensors, ...)", r.Op, r.To)
	}
	target, err := ResolveArg(r.Op, r.From)
	if err != nil {
		return HFExported{}, err
	}
	c, err := target.Load(ctx, r.Warn)
	if err != nil {
		return HFExported{}, loadError(ctx, r.Op, err)
	}
	jm, err := c.Manifest.JobModel()
	if err != nil {
		return HFExported{}, fmt.Errorf("%s: %s: %w", r.Op, c.Dir, err)
	}
	tok, note, err := data.RunTokenizer(jm.DataTrain, jm.Vocab)
	if err != nil {
		return HFExported{}, fmt.Errorf("%s: %w", r.Op, err)
	}
	if note != "" && r.Warn != nil {
		r.Warn(note)
	}
	if err := os.MkdirAll(r.To, 0o755); err != nil {
		return HFExported{}, usage.Errorf("%s: --out %s: %v; choose a writable directory", r.Op, r.To, err)
	}
	return writeHF(ctx, c, r, jm, tok)
}

// loadError is a failed Load as the commands report it.
func loadError(ctx context.Context, op string, err error) error {
	var inv *InvalidError
	switch {
	case ctx.Err() != nil:
		return context.Cause(ctx)
	case errors.As(err, &inv):
		return fmt.Errorf("%s: %w; %s", op, err, invalidHint)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// writeHF writes the model directory's files.
func writeHF(ctx context.Context, c *Checkpoint, r ExportRequest, jm JobModel, tok data.Tokenizer) (HFExported, error) {
	weights := filepath.Join(r.To, HFWeightsFile)
	ex, err := export(ctx, c, weights, ExportOptions{DType: r.DType})
	if err != nil {
		return HFExported{}, interruptedOr(ctx, err)
	}
	cfg := NewHFConfig(jm, tok.EOT(), r.DType)
	res := HFExported{Exported: ex, Dir: r.To, Files: []string{weights}, Tokenizer: tok.Name(), Config: &cfg}
	cfgPath := filepath.Join(r.To, HFConfigFile)
	err = writeAtomic(cfgPath, func(w io.Writer) error {
		b, err := json.MarshalIndent(cfg, "", "  ")
		if err == nil {
			_, err = w.Write(append(b, '\n'))
		}
		return err
	})
	if err != nil {
		return HFExported{}, fmt.Errorf("%s: write %s: %w", r.Op, cfgPath, err)
	}
	res.Files = append(res.Files, cfgPath)
	if tok.Name() != data.TokenizerGPT2 {
		// transformers has no byte-level tokenizer of 257 ids: the ids are
		// the bytes, and EOT is 256.
		return res, nil
	}
	files, err := data.WriteGPT2TokenizerFiles(r.To, jm.Seq)
	res.Files = append(res.Files, files...)
	if err != nil {
		return HFExported{}, fmt.Errorf("%s: %w", r.Op, err)
	}
	return res, nil
}
