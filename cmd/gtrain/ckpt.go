package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/charmbracelet/lipgloss"
	"github.com/spf13/cobra"

	"github.com/gtrain/gtrain/engine/ckpt"
	"github.com/gtrain/gtrain/internal/atomicfile"
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
	infos, err := ckptInfos(ctx, "ckpt ls", o.Path)
	if err != nil {
		return err
	}
	latest := -1
	for i, info := range infos {
		if info.Valid {
			latest = i
		}
	}
	if o.Output == "json" {
		return printCkptJSON(o.IO.Out, o.Path, infos, latest)
	}
	if len(infos) == 0 {
		_, err := fmt.Fprintf(o.IO.Out, "no checkpoints in %s\n", o.Path)
		return err
	}
	return printCkptTable(o.IO, infos, latest)
}

// ckptInfos describes the step directory path, or the step directories
// under the root path. A path that does not exist is a usage error.
func ckptInfos(ctx context.Context, cmd, path string) ([]ckpt.Info, error) {
	t, err := resolveCkpt(cmd, path)
	if err != nil {
		return nil, err
	}
	if t.Step != "" {
		info, err := ckpt.Describe(ctx, t.Step)
		if err != nil {
			return nil, interruptedOr(ctx, fmt.Errorf("%s: %w", cmd, err))
		}
		return []ckpt.Info{info}, nil
	}
	infos, err := ckpt.List(ctx, t.Root)
	if err != nil {
		return nil, interruptedOr(ctx, fmt.Errorf("%s: %w", cmd, err))
	}
	return infos, nil
}

// interruptedOr is err, or ctx's cause alone when ctx has ended: an
// interrupted command says only that ("gtrain: interrupted by SIGINT"), not
// which file it was reading.
func interruptedOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return context.Cause(ctx)
	}
	return err
}

// resolveCkpt is ckpt.Resolve for the command cmd: a path that does not
// exist, or is no directory, is a usage error.
func resolveCkpt(cmd, path string) (ckpt.Target, error) {
	t, err := ckpt.Resolve(path)
	if errors.Is(err, fs.ErrNotExist) {
		return t, usage.Errorf("%s: %s: no such directory", cmd, path)
	}
	if errors.Is(err, ckpt.ErrNotDir) {
		return t, usage.Errorf("%s: %s: %w", cmd, path, ckpt.ErrNotDir)
	}
	if err != nil {
		return t, fmt.Errorf("%s: %w", cmd, err)
	}
	return t, nil
}

// printCkptJSON writes {"path": ..., "latest": ..., "checkpoints": [...]}.
func printCkptJSON(w io.Writer, path string, infos []ckpt.Info, latest int) error {
	type entry struct {
		ckpt.Info
		Latest bool `json:"latest"`
	}
	doc := struct {
		Path        string  `json:"path"`
		Latest      *string `json:"latest"` // the latest valid step directory; null without one
		Checkpoints []entry `json:"checkpoints"`
	}{Path: path, Checkpoints: []entry{}}
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
func printCkptTable(ios *IOStreams, infos []ckpt.Info, latest int) error {
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
	valid := 0
	for _, info := range infos {
		if info.Valid {
			valid++
		}
	}
	fmt.Fprintf(&b, "%d of %d valid", valid, len(infos))
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

// invalidHint is said once, after the reason a checkpoint is invalid.
const invalidHint = "an invalid checkpoint is never loaded (resume takes the newest valid one): delete its directory, or restore it from a copy"

// CkptVerifyOptions are the inputs of `gtrain ckpt verify`.
type CkptVerifyOptions struct {
	IO   *IOStreams
	Path string // a step directory, or a root of them
}

// NewCmdCkptVerify is `gtrain ckpt verify`.
func NewCmdCkptVerify(ios *IOStreams) *cobra.Command {
	o := &CkptVerifyOptions{IO: ios}
	return &cobra.Command{
		Use:   "verify DIR",
		Short: "Verify a checkpoint, or every checkpoint under a root",
		Long: `Verify the checkpoint in the step directory DIR, or every step directory
when DIR is a root of them: the manifest, the size and SHA-256 of every file,
and that the files hold exactly the tensors the manifest lists. Prints one
line per checkpoint; exits 0 when all are valid, 1 otherwise, naming the
file at fault.`,
		Example: `  gtrain ckpt verify runs/gpt2/ckpt/step-00001000
  gtrain ckpt verify runs/gpt2/ckpt`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return ckptVerifyRun(cmd.Context(), o)
		},
	}
}

// ckptVerifyRun verifies and prints; the first invalid checkpoint is the
// error.
func ckptVerifyRun(ctx context.Context, o *CkptVerifyOptions) error {
	infos, err := ckptInfos(ctx, "ckpt verify", o.Path)
	if err != nil {
		return err
	}
	if len(infos) == 0 {
		return fmt.Errorf("ckpt verify: no checkpoints in %s", o.Path)
	}
	var b strings.Builder
	var bad []ckpt.Info
	for _, info := range infos {
		name := filepath.Base(info.Dir)
		if info.Valid {
			fmt.Fprintf(&b, "%s  valid (%d files, %s)\n", name, info.Files, formatSize(info.Bytes))
		} else {
			fmt.Fprintf(&b, "%s  INVALID: %s\n", name, info.Reason)
			bad = append(bad, info)
		}
	}
	if _, err := io.WriteString(o.IO.Out, b.String()); err != nil {
		return err
	}
	if len(bad) == 0 {
		return nil
	}
	first := fmt.Sprintf("%s: %s", filepath.Base(bad[0].Dir), bad[0].Reason)
	if len(infos) == 1 {
		return fmt.Errorf("ckpt verify: %s; %s", first, invalidHint)
	}
	return fmt.Errorf("ckpt verify: %d of %d checkpoints invalid, first %s; %s", len(bad), len(infos), first, invalidHint)
}

// CkptExportOptions are the inputs of `gtrain ckpt export`.
type CkptExportOptions struct {
	IO        *IOStreams
	Path      string // a step directory, or a root (its latest valid checkpoint)
	Out       string
	DType     string
	Optimizer bool
}

// NewCmdCkptExport is `gtrain ckpt export`.
func NewCmdCkptExport(ios *IOStreams) *cobra.Command {
	o := &CkptExportOptions{IO: ios}
	cmd := &cobra.Command{
		Use:   "export DIR -o FILE [flags]",
		Short: "Export a checkpoint's weights as one safetensors file",
		Long: `Export the full tensors of a checkpoint, assembled from every rank's shards,
to one safetensors file that the safetensors/PyTorch ecosystem reads
(safetensors.torch.load_file, transformers). DIR is a step directory, or a
root of them, whose newest valid checkpoint is taken (invalid newer ones are
named on stderr). The checkpoint is verified first. By default only the model
parameters are exported; --optimizer adds the optimizer state. bf16 and f16
round to nearest even, as PyTorch's .to() does. FILE is replaced atomically.`,
		Example: `  gtrain ckpt export runs/gpt2/ckpt -o model.safetensors
  gtrain ckpt export runs/gpt2/ckpt/step-00001000 -o model-bf16.safetensors --dtype bf16`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			o.Path = args[0]
			return ckptExportRun(cmd.Context(), o)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.Out, "out", "o", "", "the safetensors file to write (required)")
	f.StringVar(&o.DType, "dtype", "f32", "element type of the file: f32, bf16 or f16")
	f.BoolVar(&o.Optimizer, "optimizer", false, "export the optimizer state too (tensors named optimizer.*)")
	return cmd
}

// ckptExportRun finds, verifies and exports the checkpoint. Both read all
// of it: they stop when ctx ends, leaving no file behind.
func ckptExportRun(ctx context.Context, o *CkptExportOptions) error {
	if o.Out == "" {
		return usage.Errorf("ckpt export: -o FILE is required: the safetensors file to write")
	}
	dtype, err := ckpt.ParseDType(o.DType)
	if err != nil {
		return usage.Errorf("ckpt export: --dtype: %v", err)
	}
	// Before the checkpoint is read and verified, which can take minutes.
	var nr *atomicfile.NotRegularError
	if _, err := atomicfile.Resolve(o.Out); errors.As(err, &nr) {
		return usage.Errorf("ckpt export: -o %v", err)
	}
	target, err := resolveCkpt("ckpt export", o.Path)
	if err != nil {
		return err
	}
	c, err := target.Load(ctx, func(msg string) { fmt.Fprintf(o.IO.Err, "gtrain: warning: %s\n", msg) })
	var inv *ckpt.InvalidError
	switch {
	case err != nil && ctx.Err() != nil:
		return context.Cause(ctx)
	case errors.As(err, &inv):
		return fmt.Errorf("ckpt export: %w; %s", err, invalidHint)
	case err != nil:
		return fmt.Errorf("ckpt export: %w", err)
	}
	if err := ckpt.Export(ctx, c, o.Out, ckpt.ExportOptions{DType: dtype, Optimizer: o.Optimizer}); err != nil {
		return interruptedOr(ctx, err)
	}
	tensors, elems := exportedCount(c, o.Optimizer)
	size := "?"
	if st, err := os.Stat(o.Out); err == nil {
		size = formatSize(st.Size())
	}
	_, err = fmt.Fprintf(o.IO.Out, "exported %s (step %d) to %s: %d tensor(s), %d elements, %s as %s\n",
		filepath.Base(c.Dir), c.Step(), o.Out, tensors, elems, size, dtype)
	return err
}

// exportedCount is how many tensors and elements Export wrote.
func exportedCount(c *ckpt.Checkpoint, optimizer bool) (tensors int, elems int64) {
	for _, t := range c.Manifest.Tensors {
		if !optimizer && strings.HasPrefix(t.Name, ckpt.OptimizerPrefix) {
			continue
		}
		tensors++
		for _, s := range t.Shards {
			elems += int64(s.Len)
		}
	}
	return tensors, elems
}
