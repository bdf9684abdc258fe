// Package tfevents writes TensorBoard event files: the records of
// TensorFlow's TFRecord format (a little-endian uint64 length, the masked
// CRC-32C of those 8 bytes, the data, the masked CRC-32C of the data),
// each an Event protocol buffer (tbproto, TensorBoard's own messages),
// encoded with the official Go protobuf library. TensorBoard reads a
// directory of such files as it reads PyTorch's SummaryWriter output.
package tfevents

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"os"
	"path/filepath"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/gtrain/gtrain/internal/tfevents/tbproto"
)

// FileVersion is the first record's file_version, as TensorFlow writes it.
const FileVersion = "brain.Event:2"

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// MaskedCRC is the TFRecord checksum of b: CRC-32C, rotated right by 15
// bits plus a constant, so that a CRC of data holding CRCs stays strong.
func MaskedCRC(b []byte) uint32 {
	c := crc32.Checksum(b, castagnoli)
	return (c>>15 | c<<17) + 0xa282ead8
}

// Scalar is one tagged value of a step.
type Scalar struct {
	Tag   string
	Value float32
}

// Writer appends events to one event file.
type Writer struct {
	f    *os.File
	w    *bufio.Writer
	path string
}

// FileName is the event file's name as TensorFlow and PyTorch form it:
// events.out.tfevents.<unix seconds>.<host>.<pid>.<n>; TensorBoard reads
// any name that holds "tfevents".
func FileName(now time.Time, host string, pid, n int) string {
	return fmt.Sprintf("events.out.tfevents.%010d.%s.%d.%d", now.Unix(), host, pid, n)
}

// Create makes dir if needed and a new event file in it, and writes the
// file_version record. A name already taken (two writers in one second) gets
// the next n.
func Create(dir string, now time.Time) (*Writer, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("tfevents: %w", err)
	}
	host, _ := os.Hostname()
	var f *os.File
	var err error
	for n := 0; n < 100; n++ {
		path := filepath.Join(dir, FileName(now, host, os.Getpid(), n))
		if f, err = os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644); !os.IsExist(err) {
			break
		}
	}
	if err != nil {
		return nil, fmt.Errorf("tfevents: %w", err)
	}
	w := &Writer{f: f, w: bufio.NewWriter(f), path: f.Name()}
	ev := &tbproto.Event{WallTime: wallTime(now), What: &tbproto.Event_FileVersion{FileVersion: FileVersion}}
	if err := w.write(ev); err != nil {
		f.Close()
		return nil, err
	}
	return w, nil
}

// Path is the event file's path.
func (w *Writer) Path() string { return w.path }

func wallTime(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }

// Scalars writes values as one event of step, each as a simple_value
// (what PyTorch's SummaryWriter.add_scalar writes).
func (w *Writer) Scalars(step int64, wall float64, values []Scalar) error {
	s := &tbproto.Summary{}
	for _, v := range values {
		s.Value = append(s.Value, &tbproto.Summary_Value{Tag: v.Tag, Value: &tbproto.Summary_Value_SimpleValue{SimpleValue: v.Value}})
	}
	return w.write(&tbproto.Event{WallTime: wall, Step: step, What: &tbproto.Event_Summary{Summary: s}})
}

// Text writes text under tag for the text plugin, as add_text does: a
// string tensor of shape [1] whose metadata names the plugin "text".
func (w *Writer) Text(step int64, wall float64, tag, text string) error {
	v := &tbproto.Summary_Value{
		Tag: tag,
		Metadata: &tbproto.SummaryMetadata{
			PluginData: &tbproto.SummaryMetadata_PluginData{PluginName: "text"},
			DataClass:  tbproto.DataClass_DATA_CLASS_TENSOR,
		},
		Value: &tbproto.Summary_Value_Tensor{Tensor: &tbproto.TensorProto{
			Dtype:       tbproto.DataType_DT_STRING,
			TensorShape: &tbproto.TensorShapeProto{Dim: []*tbproto.TensorShapeProto_Dim{{Size: 1}}},
			StringVal:   [][]byte{[]byte(text)},
		}},
	}
	s := &tbproto.Summary{Value: []*tbproto.Summary_Value{v}}
	return w.write(&tbproto.Event{WallTime: wall, Step: step, What: &tbproto.Event_Summary{Summary: s}})
}

// Restart writes a SessionLog START at step, the first step a resumed run
// takes (one after its checkpoint's): TensorBoard then drops the older
// events of the steps from step on, which the resumed run writes again.
func (w *Writer) Restart(step int64, wall float64) error {
	log := &tbproto.SessionLog{Status: tbproto.SessionLog_START}
	return w.write(&tbproto.Event{WallTime: wall, Step: step, What: &tbproto.Event_SessionLog{SessionLog: log}})
}

// write appends ev as one record.
func (w *Writer) write(ev *tbproto.Event) error {
	data, err := proto.Marshal(ev)
	if err != nil {
		return fmt.Errorf("tfevents: encode step %d: %w", ev.Step, err)
	}
	var head [12]byte
	binary.LittleEndian.PutUint64(head[:8], uint64(len(data)))
	binary.LittleEndian.PutUint32(head[8:], MaskedCRC(head[:8]))
	var tail [4]byte
	binary.LittleEndian.PutUint32(tail[:], MaskedCRC(data))
	for _, b := range [][]byte{head[:], data, tail[:]} {
		if _, err := w.w.Write(b); err != nil {
			return fmt.Errorf("tfevents: %s: %w", w.path, err)
		}
	}
	return nil
}

// Flush writes what is buffered to the file, where TensorBoard sees it.
func (w *Writer) Flush() error {
	if err := w.w.Flush(); err != nil {
		return fmt.Errorf("tfevents: %s: %w", w.path, err)
	}
	return nil
}

// Sync flushes and fsyncs the file.
func (w *Writer) Sync() error {
	if err := w.Flush(); err != nil {
		return err
	}
	if err := w.f.Sync(); err != nil {
		return fmt.Errorf("tfevents: %s: %w", w.path, err)
	}
	return nil
}

// Close syncs and closes the file.
func (w *Writer) Close() error {
	err := w.Sync()
	if cerr := w.f.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("tfevents: %s: %w", w.path, cerr)
	}
	return err
}
