package main

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/engine/comm"
	"github.com/gtrain/gtrain/internal/usage"
)

// NewCmdCkpt is `gtrain ckpt`, the parent of ls, verify and export.
func NewCmdCkpt(ios *IOStreams) *cobra.Command {
	return newGroup("ckpt", "List, verify and export the built-in engine's checkpoints", `Checkpoints of the built-in engine live in one directory per step under the
job's checkpoint directory (the root): step-00000100/ holds one safetensors
file per rank and manifest.json, written last, with every file's size and
SHA-256. A step directory without a valid manifest, or whose files do not
match it, is not a checkpoint: it is never loaded.`,
		NewCmdCkptLs(ios), NewCmdCkptVerify(ios), NewCmdCkptExport(ios))
}

// CkptLsOptions are the inputs of `gtrain ckpt ls`.
type CkptLsOptions struct {
	IO     *IOStreams
	Path   string // a root of step directories, or one step directory
	Output string // text or json
}

// NewCmdCkptLs is `gtrain ckpt ls`.
func NewCmdCkptLs(ios *IOStreams) *cobra.Command {
	o := &CkptLsOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "ls ROOT",
		Short: "List the checkpoints under ROOT, each verified, the latest valid one marked",
		Long: `List the step directories under ROOT (a job's checkpoint directory, or one
step directory) with their step, creation time, size, number of files and
status. Every checkpoint is verified as a resume would (sizes and SHA-256 of
all files): "valid", or "INVALID: why". The newest valid one, the one
gtrain resume would load, is marked "latest".`,
		Example: `  gtrain ckpt ls runs/gpt2/ckpt
  gtrain ckpt ls runs/gpt2/ckpt -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return ckptLsRun(cmd.Context(), o)
		},
	}
	addOutputFlag(cmd.Flags(), &o.Output, "one document listing the steps")
	return cmd
}

// ckptLsRun prints the checkpoints of o.Path.
func ckptLsRun(ctx context.Context, o *CkptLsOptions) error {
	inv, err := ckpt.Inspect(ctx, "ckpt ls", o.Path)
	if err != nil {
		return err
	}
	if o.Output == outputJSON {
		return printCkptJSON(o.IO.Out, inv)
	}
	if len(inv.Checkpoints) == 0 {
		_, err := fmt.Fprintf(o.IO.Out, "no checkpoints in %s\n", o.Path)
		return err
	}
	return printCkptTable(o.IO, inv)
}

// printCkptJSON writes {"path": ..., "latest": ..., "checkpoints": [...]}.
func printCkptJSON(w io.Writer, inv ckpt.Inventory) error {
	infos, latest := inv.Checkpoints, inv.Latest()
	type entry struct {
		ckpt.Info
		Latest bool `json:"latest"`
	}
	doc := struct {
		Path        string  `json:"path"`
		Latest      *string `json:"latest"` // the latest valid step directory; null without one
		Checkpoints []entry `json:"checkpoints"`
	}{Path: inv.Path, Checkpoints: []entry{}}
	for i, info := range infos {
		doc.Checkpoints = append(doc.Checkpoints, entry{info, i == latest})
	}
	if latest >= 0 {
		doc.Latest = &infos[latest].Dir
	}
	return writeJSON(w, doc)
}

// printCkptTable writes one row per step directory and a summary. A status
// is always words; colour only repeats it, and not with NO_COLOR or when
// stdout is no terminal.
func printCkptTable(ios *IOStreams, inv ckpt.Inventory) error {
	infos, latest := inv.Checkpoints, inv.Latest()
	rows := make([][]string, len(infos))
	for i, info := range infos {
		rows[i] = ckptRow(info, i == latest)
	}
	cell, colour := tableCell(ios)
	good, bad := cell, cell
	if colour {
		good, bad = cell.Foreground(lipgloss.Color("2")), cell.Foreground(lipgloss.Color("1")).Bold(true)
	}
	var b strings.Builder
	b.WriteString(renderTable(cell, []string{"STEP", "DIRECTORY", "CREATED", "SIZE", "FILES", "STATUS"}, rows, func(row, col int) lipgloss.Style {
		switch {
		case col == 5 && infos[row].Valid:
			return good
		case col == 5:
			return bad
		}
		return cell
	}))
	fmt.Fprintf(&b, "%d of %d valid", inv.NumValid(), len(infos))
	if latest >= 0 {
		fmt.Fprintf(&b, "; latest: %s", infos[latest].Dir)
	}
	b.WriteString("\n")
	_, err := io.WriteString(ios.Out, b.String())
	return err
}

// ckptRow is the cells of one step directory.
func ckptRow(info ckpt.Info, latest bool) []string {
	step, created := "-", "-"
	if info.Step >= 0 {
		step = strconv.FormatInt(info.Step, 10)
	}
	if !info.Created.IsZero() {
		created = info.Created.Local().Format("2006-01-02 15:04:05")
	}
	status := "valid"
	switch {
	case latest:
		status = "valid, latest"
	case !info.Valid:
		status = "INVALID: " + info.Reason
	}
	return []string{step, filepath.Base(info.Dir), created, formatSize(info.Bytes), strconv.Itoa(info.Files), status}
}

// formatSize is a byte count for people: 512 B, 3.0 MiB, 1.4 GiB.
func formatSize(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 4; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTP"[exp])
}

// CkptVerifyOptions are the inputs of `gtrain ckpt verify`.
type CkptVerifyOptions struct {
	IO     *IOStreams
	Path   string // a step directory, or a root of them
	Output string // text or json
}

// NewCmdCkptVerify is `gtrain ckpt verify`.
func NewCmdCkptVerify(ios *IOStreams) *cobra.Command {
	o := &CkptVerifyOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "verify DIR",
		Short: "Verify a checkpoint, or every checkpoint under a root",
		Long: `Verify the checkpoint in the step directory DIR, or every step directory
when DIR is a root of them: the manifest, the size and SHA-256 of every file,
and that the files hold exactly the tensors the manifest lists. Prints one
line per checkpoint (with -o json, one document); exits 0 when all are
valid, 1 otherwise, naming the file at fault.`,
		Example: `  gtrain ckpt verify runs/gpt2/ckpt/step-00001000
  gtrain ckpt verify runs/gpt2/ckpt -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return ckptVerifyRun(cmd.Context(), o)
		},
	}
	addOutputFlag(cmd.Flags(), &o.Output, `one document: "valid" (all of them) and each checkpoint's verdict`)
	return cmd
}

// ckptVerifyRun verifies and prints; the first invalid checkpoint is the
// error.
func ckptVerifyRun(ctx context.Context, o *CkptVerifyOptions) error {
	inv, err := ckpt.Inspect(ctx, "ckpt verify", o.Path)
	if err != nil {
		return err
	}
	verdict := inv.Check("ckpt verify")
	if o.Output == outputJSON {
		err = writeJSON(o.IO.Out, struct {
			Path        string      `json:"path"`
			Valid       bool        `json:"valid"`
			Checkpoints []ckpt.Info `json:"checkpoints"`
		}{inv.Path, verdict == nil, append([]ckpt.Info{}, inv.Checkpoints...)}) // [], not null, when empty
	} else {
		err = printVerdicts(o.IO.Out, inv.Checkpoints)
	}
	if err != nil {
		return err
	}
	return verdict
}

// printVerdicts writes one line per checkpoint.
func printVerdicts(w io.Writer, infos []ckpt.Info) error {
	var b strings.Builder
	for _, info := range infos {
		name := filepath.Base(info.Dir)
		if info.Valid {
			fmt.Fprintf(&b, "%s  valid (%d files, %s)\n", name, info.Files, formatSize(info.Bytes))
		} else {
			fmt.Fprintf(&b, "%s  INVALID: %s\n", name, info.Reason)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// CkptExportOptions are the inputs of `gtrain ckpt export`.
type CkptExportOptions struct {
	IO        *IOStreams
	Path      string // a step directory, or a root (its latest valid checkpoint)
	Out       string // the safetensors file to write; a directory for --format hf
	Format    string // safetensors or hf
	DType     string
	Optimizer bool
	Output    string // text or json: what was written
}

// NewCmdCkptExport is `gtrain ckpt export`.
func NewCmdCkptExport(ios *IOStreams) *cobra.Command {
	o := &CkptExportOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "export DIR --out FILE [flags]",
		Short: "Export a checkpoint's weights as one safetensors file, or a Hugging Face model directory",
		Long: `Export the full tensors of a checkpoint, assembled from every rank's shards,
to one safetensors file that the safetensors/PyTorch ecosystem reads
(safetensors.torch.load_file, transformers). DIR is a step directory, or a
root of them, whose newest valid checkpoint is taken (invalid newer ones are
named on stderr). The checkpoint is verified first. By default only the model
parameters are exported; --optimizer adds the optimizer state. bf16 and f16
round to nearest even, as PyTorch's .to() does. FILE is replaced atomically.
What was written (file, step, tensors, bytes, dtype) is printed, or with
-o json one document.

With --format hf, --out is a directory that GPT2LMHeadModel.from_pretrained
loads, written as save_pretrained writes one (created if missing; its files
replaced, others left alone): model.safetensors (the model parameters under
GPT-2's names), config.json (GPT2Config: n_layer, n_head, n_embd,
n_positions, vocab_size, gelu_new, layer_norm_epsilon 1e-5, tied embeddings,
no dropout, torch_dtype of --dtype) and, for a run on GPT-2 BPE data
(gtrain data prepare --tokenizer gpt2), GPT2Tokenizer's vocab.json,
merges.txt and tokenizer_config.json. A byte-level run has no tokenizer
files: its ids are the bytes, and end-of-text (bos/eos_token_id) is 256.`,
		Example: `  gtrain ckpt export runs/gpt2/ckpt --out model.safetensors
  gtrain ckpt export runs/gpt2/ckpt/step-00001000 --out model-bf16.safetensors --dtype bf16 -o json
  gtrain ckpt export --format hf runs/gpt2/ckpt --out hf/gpt2-mine`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return ckptExportRun(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Out, "out", "", "the safetensors file to write, or with --format hf the directory (required)")
	f.StringVar(&o.Format, "format", "safetensors", "safetensors (one file) or hf (a Hugging Face model directory)")
	f.StringVar(&o.DType, "dtype", "f32", "element type of the file: f32, bf16 or f16")
	f.BoolVar(&o.Optimizer, "optimizer", false, "export the optimizer state too (tensors named optimizer.*)")
	addOutputFlag(f, &o.Output, "what was written: path, step, tensors, elements, bytes, dtype")
	return cmd
}

// ckptExportRun finds, verifies and exports the checkpoint, and says what
// it wrote. Both read all of it: they stop when ctx ends, leaving no file
// behind.
func ckptExportRun(ctx context.Context, o *CkptExportOptions) error {
	if o.Out == "" {
		return usage.Errorf("ckpt export: --out FILE is required: the safetensors file to write")
	}
	dtype, err := comm.ParseDType(o.DType)
	if err != nil {
		return usage.Errorf("ckpt export: --dtype: %v", err)
	}
	req := ckpt.ExportRequest{
		Op: "ckpt export", From: o.Path, To: o.Out,
		ExportOptions: ckpt.ExportOptions{DType: dtype, Optimizer: o.Optimizer},
		Warn:          func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) },
	}
	switch o.Format {
	case "hf":
		return ckptExportHF(ctx, o, req)
	case "safetensors", "":
	default:
		return usage.Errorf("ckpt export: --format %q: want safetensors or hf", o.Format)
	}
	res, err := ckpt.ExportPath(ctx, req)
	if err != nil {
		return err
	}
	if o.Output == outputJSON {
		return writeJSON(o.IO.Out, res)
	}
	_, err = fmt.Fprintf(o.IO.Out, "exported %s (step %d) to %s: %d tensor(s), %d elements, %s as %s\n",
		filepath.Base(res.Checkpoint), res.Step, res.Path, res.Tensors, res.Elements, formatSize(res.Bytes), res.DType)
	return err
}

// ckptExportHF writes a Hugging Face model directory and says what it
// wrote.
func ckptExportHF(ctx context.Context, o *CkptExportOptions, req ckpt.ExportRequest) error {
	res, err := ckpt.ExportHF(ctx, req)
	if err != nil {
		return err
	}
	if o.Output == outputJSON {
		return writeJSON(o.IO.Out, res)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "exported %s (step %d) to %s for transformers (GPT2LMHeadModel, tokenizer %s): %d tensor(s), %s as %s\n",
		filepath.Base(res.Checkpoint), res.Step, res.Dir, res.Tokenizer, res.Tensors, formatSize(res.Bytes), res.DType)
	for _, f := range res.Files {
		fmt.Fprintf(&b, "wrote %s\n", f)
	}
	_, err = io.WriteString(o.IO.Out, b.String())
	return err
}
