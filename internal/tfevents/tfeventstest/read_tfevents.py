"""Reads TensorBoard event files with Python's google.protobuf, a reader
independent of gtrain's Go encoder: it checks every record's length and
data CRCs (masked CRC-32C, computed here) and prints each event as a JSON
line. Usage: read_tfevents.py GENDIR FILE... (GENDIR holds tfevents_pb2.py,
made by protoc --python_out)."""

import json
import struct
import sys

sys.path.insert(0, sys.argv[1])
import tfevents_pb2  # noqa: E402


def crc32c_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


TABLE = crc32c_table()


def masked_crc(data):
    c = 0xFFFFFFFF
    for b in data:
        c = TABLE[(c ^ b) & 0xFF] ^ (c >> 8)
    c ^= 0xFFFFFFFF
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def records(path):
    with open(path, "rb") as f:
        buf = f.read()
    off = 0
    while off < len(buf):
        head = buf[off:off + 8]
        (n,) = struct.unpack("<Q", head)
        (hcrc,) = struct.unpack("<I", buf[off + 8:off + 12])
        if hcrc != masked_crc(head):
            raise SystemExit("%s: offset %d: bad length CRC" % (path, off))
        data = buf[off + 12:off + 12 + n]
        (dcrc,) = struct.unpack("<I", buf[off + 12 + n:off + 16 + n])
        if len(data) != n or dcrc != masked_crc(data):
            raise SystemExit("%s: offset %d: bad data CRC" % (path, off))
        off += 16 + n
        yield data


for path in sys.argv[2:]:
    for data in records(path):
        ev = tfevents_pb2.Event()
        ev.ParseFromString(data)
        out = {"file": path, "wall_time": ev.wall_time, "step": ev.step, "what": ev.WhichOneof("what")}
        if out["what"] == "file_version":
            out["file_version"] = ev.file_version
        elif out["what"] == "session_log":
            out["session_status"] = tfevents_pb2.SessionLog.SessionStatus.Name(ev.session_log.status)
        elif out["what"] == "summary":
            vals = []
            for v in ev.summary.value:
                kind = v.WhichOneof("value")
                if kind == "simple_value":
                    vals.append({"tag": v.tag, "simple_value": v.simple_value})
                else:
                    vals.append({"tag": v.tag, "plugin": v.metadata.plugin_data.plugin_name,
                                 "dtype": tfevents_pb2.DataType.Name(v.tensor.dtype),
                                 "text": [s.decode() for s in v.tensor.string_val]})
            out["values"] = vals
        print(json.dumps(out))
