package train

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/internal/usage"
)

// maxSeriesPoints bounds the steps a RunSummary holds: ten million steps
// are far beyond any run of this engine, and 240 MB of points.
const maxSeriesPoints = 10_000_000

// RunSummary is a run directory's metrics at a glance: what `gtrain runs
// show` prints, and with --output json.
type RunSummary struct {
	Dir    string `json:"dir"`
	Layout string `json:"layout,omitempty"` // of the newest checkpoint; "" without one
	Steps  int    `json:"steps"`            // the job's steps
	// LastStep is the newest step recorded, Loss its training loss;
	// ValLoss the last validation loss, of step ValStep.
	LastStep int      `json:"last_step"`
	Loss     float32  `json:"loss"`
	ValLoss  *float32 `json:"val_loss,omitempty"`
	ValStep  int      `json:"val_step,omitempty"`
	// TokensPerS is the mean of the steps' tokens per second.
	TokensPerS float64 `json:"tokens_per_s"`
	// TrainSeconds is the steps' time in total; WallSeconds the time from
	// the first step's start to the last step's end, pauses included.
	TrainSeconds float64       `json:"train_seconds"`
	WallSeconds  float64       `json:"wall_seconds"`
	Series       []SeriesPoint `json:"series"`
}

// SeriesPoint is one step of a RunSummary's series.
type SeriesPoint struct {
	Step    int      `json:"step"`
	Loss    float32  `json:"loss"`
	ValLoss *float32 `json:"val_loss,omitempty"`
}

// SummarizeRun reads the metrics file of the run directory dir.
func SummarizeRun(dir string) (RunSummary, error) {
	s := RunSummary{Dir: dir}
	path := filepath.Join(dir, MetricsFile)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		what := "not a directory"
		var pe *fs.PathError
		switch {
		case errors.As(err, &pe) && !errors.Is(err, fs.ErrNotExist):
			what = pe.Err.Error() // a loop of links, no permission
		case err != nil:
			what = "no such directory"
		}
		return s, usage.Errorf("runs: %s: %s: name a run directory of the built-in engine (its checkpoint.dir)", dir, what)
	}
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return s, usage.Errorf("runs: %s: no %s in it: name a run directory of the built-in engine (its checkpoint.dir), where every run keeps one", dir, MetricsFile)
	case !fi.Mode().IsRegular():
		// A FIFO would block the read, a device never end it.
		return s, usage.Errorf("runs: %s: not a regular file: name a run directory of the built-in engine (its checkpoint.dir)", path)
	}
	var first MetricsLine
	var tokens float64
	err = ReadMetrics(path, func(m MetricsLine) error {
		if len(s.Series) == maxSeriesPoints {
			return fmt.Errorf("more than %d steps", maxSeriesPoints)
		}
		if len(s.Series) == 0 {
			first = m
		}
		s.add(m)
		tokens += m.TokensPerS
		return nil
	})
	if err != nil {
		return s, fmt.Errorf("runs: %w", err)
	}
	if n := len(s.Series); n > 0 {
		s.TokensPerS = tokens / float64(n)
		s.WallSeconds = max(0, s.WallSeconds-first.Time+first.StepMillis/1000)
	}
	s.Layout = newestLayout(dir)
	return s, nil
}

// add takes m into s; WallSeconds holds the last record's time until
// SummarizeRun makes it a span.
func (s *RunSummary) add(m MetricsLine) {
	p := SeriesPoint{Step: m.Step, Loss: m.Loss}
	if m.ValLoss != nil {
		v := *m.ValLoss
		p.ValLoss, s.ValLoss, s.ValStep = &v, &v, m.Step
	}
	s.Series = append(s.Series, p)
	s.Steps, s.LastStep, s.Loss = m.Steps, m.Step, m.Loss
	s.TrainSeconds += m.StepMillis / 1000
	s.WallSeconds = m.Time
}

// newestLayout is the layout of the newest step directory's manifest in
// dir, "" without one. The manifest is read, not verified: a summary does
// not read every checkpoint file.
func newestLayout(dir string) string {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return ""
	}
	var steps []string
	for _, e := range entries {
		if _, ok := ckpt.ParseStepDir(e.Name()); ok && e.IsDir() {
			steps = append(steps, e.Name())
		}
	}
	slices.Sort(steps)
	for _, name := range slices.Backward(steps) {
		if l, err := readLayout(filepath.Join(dir, name, ckpt.ManifestName)); err == nil {
			return l
		}
	}
	return ""
}

// readLayout describes the layout of the manifest path.
func readLayout(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, 64<<20))
	if err != nil {
		return "", err
	}
	var m ckpt.Manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return "", err
	}
	var job struct {
		Precision string `json:"precision"`
	}
	json.Unmarshal(m.Job, &job)
	l := m.Layout
	parts := []string{fmt.Sprintf("dp %d", l.DP), fmt.Sprintf("tp %d", max(l.TP, 1)), fmt.Sprintf("pp %d", max(l.PP, 1)),
		fmt.Sprintf("ZeRO stage %d", l.ZeroStage)}
	if job.Precision != "" {
		parts = append(parts, job.Precision)
	}
	return fmt.Sprintf("%s (%d ranks)", strings.Join(parts, ", "), l.World), nil
}

// MarshalJSON writes p with a loss that is not finite as a string, as
// status records write it.
func (p SeriesPoint) MarshalJSON() ([]byte, error) {
	w := struct {
		Step    int          `json:"step"`
		Loss    jsonFloat32  `json:"loss"`
		ValLoss *jsonFloat32 `json:"val_loss,omitempty"`
	}{Step: p.Step, Loss: jsonFloat32(p.Loss), ValLoss: (*jsonFloat32)(p.ValLoss)}
	return json.Marshal(w)
}

// MarshalJSON writes s with values that are not finite as strings.
func (s RunSummary) MarshalJSON() ([]byte, error) {
	type plain RunSummary // without this method
	w := struct {
		plain
		Loss       jsonFloat32  `json:"loss"`
		ValLoss    *jsonFloat32 `json:"val_loss,omitempty"`
		TokensPerS jsonFloat    `json:"tokens_per_s"`
	}{plain: plain(s), Loss: jsonFloat32(s.Loss), ValLoss: (*jsonFloat32)(s.ValLoss), TokensPerS: jsonFloat(s.TokensPerS)}
	return json.Marshal(w)
}
