#!/usr/bin/env python3
"""Independent safetensors reader for the gradsnap CLI tests (standard library only).

usage: read_safetensors.py FILE EXPECTED.json

EXPECTED.json: {"tensors": [{"name", "dtype", "shape", "sha256"}, ...], "metadata": {k: v}}.
Parses FILE per the safetensors spec (8-byte little-endian header length, JSON header,
raw data), checks that the data offsets tile the data section exactly in order, that every
size matches dtype x shape, and that names, dtypes, shapes, SHA-256 of the bytes and the given
metadata keys match EXPECTED. Prints "ok N tensors" and exits 0, or prints why and exits 1.
"""
import hashlib
import json
import struct
import sys

DTYPE_SIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2,
              "I8": 1, "U8": 1, "BOOL": 1}


def fail(msg):
    print("read_safetensors: " + msg)
    sys.exit(1)


def main():
    if len(sys.argv) != 3:
        fail("usage: read_safetensors.py FILE EXPECTED.json")
    with open(sys.argv[2]) as f:
        expected = json.load(f)
    with open(sys.argv[1], "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        fail("file shorter than 8 bytes")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        fail("header length %d past the end of the file" % n)
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = blob[8 + n:]
    meta = header.pop("__metadata__", {})
    for k, v in expected.get("metadata", {}).items():
        if meta.get(k) != v:
            fail("metadata %s = %r, want %r" % (k, meta.get(k), v))
    # Tensors ordered by offset must tile data[0, len(data)).
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    pos = 0
    for name, e in entries:
        begin, end = e["data_offsets"]
        if begin != pos or end < begin:
            fail("tensor %s offsets %r do not follow %d" % (name, e["data_offsets"], pos))
        numel = 1
        for d in e["shape"]:
            numel *= d
        if e["dtype"] not in DTYPE_SIZE:
            fail("tensor %s unknown dtype %s" % (name, e["dtype"]))
        if numel * DTYPE_SIZE[e["dtype"]] != end - begin:
            fail("tensor %s size %d != shape %r x %s" % (name, end - begin, e["shape"], e["dtype"]))
        pos = end
    if pos != len(data):
        fail("data section has %d bytes, tensors cover %d" % (len(data), pos))
    want = expected["tensors"]
    if sorted(header) != sorted(t["name"] for t in want):
        fail("tensor names %r, want %r" % (sorted(header), sorted(t["name"] for t in want)))
    for t in want:
        e = header[t["name"]]
        if e["dtype"] != t["dtype"]:
            fail("tensor %s dtype %s, want %s" % (t["name"], e["dtype"], t["dtype"]))
        if e["shape"] != t["shape"]:
            fail("tensor %s shape %r, want %r" % (t["name"], e["shape"], t["shape"]))
        begin, end = e["data_offsets"]
        digest = hashlib.sha256(data[begin:end]).hexdigest()
        if digest != t["sha256"]:
            fail("tensor %s sha256 %s, want %s" % (t["name"], digest, t["sha256"]))
    print("ok %d tensors" % len(want))


if __name__ == "__main__":
    main()
