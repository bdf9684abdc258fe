package ckpt

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// JobModel is what a checkpoint's job (the resolved spec engine/train
// records in the manifest) says of the model and its data: the shape of
// the GPT (engine/model.Config's fields, under the same JSON names) and
// the token file it trained on ("" for the synthetic corpus).
type JobModel struct {
	Layers int `json:"layers"`
	Heads  int `json:"heads"`
	Embd   int `json:"embd"`
	Seq    int `json:"seq"`
	Vocab  int `json:"vocab"`
	// DataTrain is the job's data.train, whose directory's meta.json names
	// the tokenizer.
	DataTrain string `json:"-"`
}

// maxDim bounds each field of a JobModel read from a manifest, as
// engine/model's Validate bounds a shape (its largest bound, 2^20).
const maxDim = 1 << 20

// JobModel reads the model's shape and data from the manifest's job, and
// checks them against its tensors: the token and position embeddings must
// be [vocab, embd] and [seq, embd], and there must be a block per layer.
func (m *Manifest) JobModel() (JobModel, error) {
	var job struct {
		Model JobModel `json:"model"`
		Data  struct {
			Train string `json:"train"`
		} `json:"data"`
	}
	if len(m.Job) == 0 {
		return JobModel{}, fmt.Errorf("the manifest records no job: it was not written by gtrain's engine")
	}
	if err := json.Unmarshal(m.Job, &job); err != nil {
		return JobModel{}, fmt.Errorf("the manifest's job: %w", err)
	}
	jm := job.Model
	jm.DataTrain = job.Data.Train
	for _, f := range []struct {
		name string
		v    int
	}{{"layers", jm.Layers}, {"heads", jm.Heads}, {"embd", jm.Embd}, {"seq", jm.Seq}, {"vocab", jm.Vocab}} {
		if f.v < 1 || f.v > maxDim {
			return JobModel{}, fmt.Errorf("the manifest's job has model.%s %d: want 1 to %d", f.name, f.v, maxDim)
		}
	}
	if jm.Embd%jm.Heads != 0 {
		return JobModel{}, fmt.Errorf("the manifest's job has model.embd %d, not a multiple of model.heads %d", jm.Embd, jm.Heads)
	}
	return jm, jm.check(m)
}

// check compares the shape with the manifest's tensors.
func (jm JobModel) check(m *Manifest) error {
	want := map[string][]int{
		"transformer.wte.weight":                                 {jm.Vocab, jm.Embd},
		"transformer.wpe.weight":                                 {jm.Seq, jm.Embd},
		fmt.Sprintf("transformer.h.%d.ln_1.weight", jm.Layers-1): {jm.Embd},
		"transformer.ln_f.weight":                                {jm.Embd},
	}
	for name, shape := range want {
		i, ok := slices.BinarySearchFunc(m.Tensors, name, byName)
		if !ok {
			return fmt.Errorf("no tensor %s for the job's model (%d layers)", name, jm.Layers)
		}
		if !slices.Equal(m.Tensors[i].Shape, shape) {
			return fmt.Errorf("tensor %s has shape %v, the job's model %v", name, m.Tensors[i].Shape, shape)
		}
	}
	if _, ok := slices.BinarySearchFunc(m.Tensors, fmt.Sprintf("transformer.h.%d.ln_1.weight", jm.Layers), byName); ok {
		return fmt.Errorf("the checkpoint has more blocks than the job's %d layers", jm.Layers)
	}
	return nil
}

// byName orders a tensor against a name, for a search of the sorted index.
func byName(t TensorIndex, name string) int { return strings.Compare(t.Name, name) }
