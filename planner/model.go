package planner

import (
	"fmt"
	"math"
	"strings"
)

// Arch is a transformer family: where it has biases, how its MLP is built,
// whether its output layer shares the embedding.
type Arch string

// The architectures the cost model knows.
const (
	// ArchGPT is GPT-2/GPT-3/Megatron: biases, LayerNorm, learned positions,
	// a GELU MLP of two matrices, the output layer tied to the embedding.
	ArchGPT Arch = "gpt"
	// ArchLlama is Llama: no biases, RMSNorm, rotary positions, a SwiGLU MLP
	// of three matrices, grouped-query attention, an untied output layer.
	ArchLlama Arch = "llama"
)

// Model is the shape of a decoder-only transformer.
type Model struct {
	Name    string `json:"name,omitempty"`
	Arch    Arch   `json:"arch"`
	Layers  int    `json:"layers"`
	Hidden  int    `json:"hidden"`
	Heads   int    `json:"heads"`
	KVHeads int    `json:"kv_heads"` // key/value heads (grouped-query attention); Heads when equal
	FFN     int    `json:"ffn"`      // MLP inner size
	Vocab   int    `json:"vocab"`
	Seq     int    `json:"seq"` // training sequence length
	// Positions is the rows of GPT's learned position embedding
	// (Megatron-LM's max_position_embeddings), when more than Seq: a
	// model trained on shorter sequences than its context holds them all.
	Positions int `json:"positions,omitempty"`
}

// Preset is a named published model, with the global batch (sequences) it
// was trained or benchmarked with, and where its shape comes from.
type Preset struct {
	Model       Model
	GlobalBatch int
	Source      string
}

func gpt(name string, l, h, a, v, s, batch int, src string) Preset {
	return Preset{Model{Name: name, Arch: ArchGPT, Layers: l, Hidden: h, Heads: a, KVHeads: a, FFN: 4 * h, Vocab: v, Seq: s}, batch, src}
}

func llama(name string, l, h, a, kv, f, v, s, batch int, src string) Preset {
	return Preset{Model{Name: name, Arch: ArchLlama, Layers: l, Hidden: h, Heads: a, KVHeads: kv, FFN: f, Vocab: v, Seq: s}, batch, src}
}

const (
	srcGPT2     = "Radford et al. 2019 (GPT-2), Hugging Face configs"
	srcGPT3     = "Brown et al. 2020 (GPT-3), Table 2.1; batch in sequences of 2048"
	srcMegatron = "Narayanan et al. 2021 (Megatron-LM), Table 1"
	srcLlama2   = "Touvron et al. 2023 (Llama 2), Hugging Face configs; 4M-token batch"
	srcLlama3   = "Llama 3 herd paper 2024, Hugging Face configs; batch in sequences of 8192"
)

// Presets are the models --model names.
var Presets = map[string]Preset{
	"gpt2":        gpt("gpt2", 12, 768, 12, 50257, 1024, 512, srcGPT2),
	"gpt2-medium": gpt("gpt2-medium", 24, 1024, 16, 50257, 1024, 512, srcGPT2),
	"gpt2-large":  gpt("gpt2-large", 36, 1280, 20, 50257, 1024, 512, srcGPT2),
	"gpt2-xl":     gpt("gpt2-xl", 48, 1600, 25, 50257, 1024, 512, srcGPT2),
	"gpt3-2.7b":   gpt("gpt3-2.7b", 32, 2560, 32, 50257, 2048, 512, srcGPT3),
	"gpt3-6.7b":   gpt("gpt3-6.7b", 32, 4096, 32, 50257, 2048, 1024, srcGPT3),
	"gpt3-175b":   gpt("gpt3-175b", 96, 12288, 96, 50257, 2048, 1536, srcGPT3),
	// Narayanan et al. 2021, Table 1: vocabulary 51200, sequence 2048.
	"megatron-1.7b": gpt("megatron-1.7b", 24, 2304, 24, 51200, 2048, 512, srcMegatron),
	"megatron-3.6b": gpt("megatron-3.6b", 30, 3072, 32, 51200, 2048, 512, srcMegatron),
	"megatron-7.5b": gpt("megatron-7.5b", 36, 4096, 32, 51200, 2048, 512, srcMegatron),
	"megatron-18b":  gpt("megatron-18b", 40, 6144, 48, 51200, 2048, 1024, srcMegatron),
	"megatron-39b":  gpt("megatron-39b", 48, 8192, 64, 51200, 2048, 1536, srcMegatron),
	"megatron-76b":  gpt("megatron-76b", 60, 10240, 80, 51200, 2048, 1792, srcMegatron),
	"megatron-146b": gpt("megatron-146b", 80, 12288, 96, 51200, 2048, 2304, srcMegatron),
	"megatron-310b": gpt("megatron-310b", 96, 16384, 128, 51200, 2048, 2160, srcMegatron),
	"megatron-530b": gpt("megatron-530b", 105, 20480, 128, 51200, 2048, 2520, srcMegatron),
	"megatron-1t":   gpt("megatron-1t", 128, 25600, 160, 51200, 2048, 3072, srcMegatron),
	"llama2-7b":     llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000, 4096, 1024, srcLlama2),
	"llama2-13b":    llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000, 4096, 1024, srcLlama2),
	"llama2-70b":    llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000, 4096, 1024, srcLlama2),
	"llama3-8b":     llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, 512, srcLlama3),
	"llama3-70b":    llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256, 8192, 512, srcLlama3),
	"llama3-405b":   llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256, 8192, 2048, srcLlama3),
}

// LookupPreset returns the named preset, or an error listing the names.
func LookupPreset(name string) (Preset, error) {
	p, ok := Presets[strings.ToLower(strings.TrimSpace(name))]
	if !ok {
		return Preset{}, fmt.Errorf("model %q: unknown preset: want one of %s", name, strings.Join(sortedKeys(Presets), ", "))
	}
	return p, nil
}

// FromParams is a GPT-3-style shape of about n parameters, for --params:
// head size 128 and hidden ≈ layers × 128 (the aspect of GPT-3 175B), so
// 12·layers·hidden² ≈ n gives hidden = (128·n/12)^(1/3), rounded to a
// multiple of 128; vocabulary 51200 and sequence 2048 as in Megatron-LM.
func FromParams(n float64) (Model, error) {
	if !(n >= 1e6) || n > 1e15 {
		return Model{}, fmt.Errorf("params %g: want 1e6 to 1e15", n)
	}
	h := max(128, int(math.Round(math.Cbrt(128*n/12)/128))*128)
	l := max(1, int(math.Round(n/(12*float64(h)*float64(h)))))
	return Model{Name: fmt.Sprintf("gpt-%s", humanCount(n)), Arch: ArchGPT, Layers: l, Hidden: h, Heads: h / 128,
		KVHeads: h / 128, FFN: 4 * h, Vocab: 51200, Seq: 2048}, nil
}

// Normalized fills what the shape leaves open: KVHeads = Heads, FFN = 4h
// (GPT) or Llama's 8h/3 rounded up to a multiple of 256, and Arch gpt.
func (m Model) Normalized() Model {
	if m.Arch == "" {
		m.Arch = ArchGPT
	}
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	if m.FFN == 0 {
		if m.Arch == ArchLlama {
			m.FFN = (8*m.Hidden/3 + 255) / 256 * 256
		} else {
			m.FFN = 4 * m.Hidden
		}
	}
	return m
}

// Validate reports the first field that makes m unusable.
func (m Model) Validate() error {
	const big = 1 << 24
	switch {
	case m.Arch != ArchGPT && m.Arch != ArchLlama:
		return fmt.Errorf("model: arch %q: want gpt or llama", m.Arch)
	case m.Layers < 1 || m.Layers > big:
		return fmt.Errorf("model: layers %d: must be 1 to %d", m.Layers, big)
	case m.Heads < 1 || m.Heads > big:
		return fmt.Errorf("model: heads %d: must be 1 to %d", m.Heads, big)
	case m.Hidden < 1 || m.Hidden > big || m.Hidden%m.Heads != 0:
		return fmt.Errorf("model: hidden %d: must be a positive multiple of heads (%d)", m.Hidden, m.Heads)
	case m.KVHeads < 1 || m.KVHeads > m.Heads || m.Heads%m.KVHeads != 0:
		return fmt.Errorf("model: kv-heads %d: must divide heads (%d)", m.KVHeads, m.Heads)
	case m.FFN < 1 || m.FFN > big:
		return fmt.Errorf("model: ffn %d: must be 1 to %d", m.FFN, big)
	case m.Vocab < 1 || m.Vocab > big:
		return fmt.Errorf("model: vocab %d: must be 1 to %d", m.Vocab, big)
	case m.Seq < 1 || m.Seq > big:
		return fmt.Errorf("model: seq %d: must be 1 to %d", m.Seq, big)
	case m.Positions < 0 || m.Positions > big:
		return fmt.Errorf("model: positions %d: must be 0 (the seq) to %d", m.Positions, big)
	}
	return nil
}

// qkvWidth is the output width of the fused QKV projection: all query heads
// plus the key and value heads.
func (m Model) qkvWidth() float64 {
	return float64(m.Hidden) * (1 + 2*float64(m.KVHeads)/float64(m.Heads))
}

// mlpMatrices is 2 for a GELU MLP, 3 for SwiGLU (gate, up, down).
func (m Model) mlpMatrices() float64 {
	if m.Arch == ArchLlama {
		return 3
	}
	return 2
}

// MatrixParams is the weight count of one layer's matrix multiplies: QKV,
// the attention output projection and the MLP. Each costs 2 FLOPs per
// weight per token forward.
func (m Model) MatrixParams() float64 {
	h := float64(m.Hidden)
	return h*m.qkvWidth() + h*h + m.mlpMatrices()*h*float64(m.FFN)
}

// LayerParams is the parameter count of one transformer layer: matrices,
// biases (GPT) and the two norms. GPT: 12h² + 13h.
func (m Model) LayerParams() float64 {
	h, f := float64(m.Hidden), float64(m.FFN)
	if m.Arch == ArchLlama {
		return m.MatrixParams() + 2*h // two RMSNorm weights
	}
	return m.MatrixParams() + m.qkvWidth() + h + f + h + 4*h // biases, two LayerNorms
}

// EmbeddingParams is the first stage's extra: token embedding, plus learned
// positions for GPT.
func (m Model) EmbeddingParams() float64 {
	return float64(m.Vocab)*float64(m.Hidden) + m.positionParams()
}

// positionParams is GPT's learned position embedding (none for Llama).
func (m Model) positionParams() float64 {
	if m.Arch != ArchGPT {
		return 0
	}
	return float64(max(m.Positions, m.Seq)) * float64(m.Hidden)
}

// normParams is one LayerNorm's parameters (weight and bias), or one
// RMSNorm's (a weight).
func (m Model) normParams() float64 {
	if m.Arch == ArchLlama {
		return float64(m.Hidden)
	}
	return 2 * float64(m.Hidden)
}

// rankLayerParams is what one of t TP ranks holds of a layer under
// Megatron-LM's tensor parallelism: the matrices, and the biases of the
// column-parallel ones, split over t; the two norms and the biases of the
// row-parallel projections replicated on every rank.
func (m Model) rankLayerParams(t int) float64 {
	h, f := float64(m.Hidden), float64(m.FFN)
	if m.Arch == ArchLlama {
		return m.MatrixParams()/float64(t) + 2*m.normParams()
	}
	return (m.MatrixParams()+m.qkvWidth()+f)/float64(t) + 2*m.normParams() + 2*h
}

// HeadParams is the last stage's extra: the final norm, and for untied
// models (Llama) the output layer. With pipeline parallelism a tied model's
// last stage also holds a copy of the embedding (Megatron-LM); that copy is
// counted by the memory model, not here.
func (m Model) HeadParams() float64 {
	h := float64(m.Hidden)
	if m.Arch == ArchLlama {
		return float64(m.Vocab)*h + h
	}
	return 2 * h
}

// Params is the model's parameter count (a tied output layer counted once).
func (m Model) Params() float64 {
	return float64(m.Layers)*m.LayerParams() + m.EmbeddingParams() + m.HeadParams()
}

// humanCount is 1.5B, 175B, 1T, 350M.
func humanCount(n float64) string {
	switch {
	case n >= 1e12:
		return strings.TrimSuffix(fmt.Sprintf("%.3g", n/1e12), ".0") + "T"
	case n >= 1e9:
		return fmt.Sprintf("%.3gB", n/1e9)
	default:
		return fmt.Sprintf("%.3gM", n/1e6)
	}
}
