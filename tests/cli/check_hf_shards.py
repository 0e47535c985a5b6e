#!/usr/bin/env python3
"""Checks a sharded consolidated model against the same model in one file, as transformers
would load it (standard library only; tests/trainer/reshard_e2e_test.cc).

usage: check_hf_shards.py SHARDED_DIR SINGLE_FILE MAX_SHARD_BYTES MIN_FILES

SHARDED_DIR must hold model.safetensors.index.json ({"metadata": {"total_size"}, "weight_map":
{name: file}}), no model.safetensors, and the files the map names, model-0000i-of-0000n
.safetensors for i in 1..n, n >= MIN_FILES; each file's tensors sum to at most MAX_SHARD_BYTES
(unless it holds one tensor), every tensor of SINGLE_FILE appears in exactly one of them with
the same dtype, shape and bytes, total_size is their sum, and every file's __metadata__ says
format "pt". Prints "ok N files" and exits 0,
or prints why and exits 1.
"""
import json
import os
import struct
import sys


def fail(msg):
    print("check_hf_shards: " + msg)
    sys.exit(1)


def read(path):
    """{name: (dtype, shape, bytes)} of a safetensors file. Its __metadata__ must say format
    "pt": transformers refuses a safetensors file whose format is not pt, tf, flax or mlx."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    fmt = header.pop("__metadata__", {}).get("format")
    if fmt != "pt":
        fail(f"{path}: __metadata__ format {fmt!r}, want 'pt' (transformers refuses others)")
    data = blob[8 + n:]
    return {k: (v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items()}


def main():
    if len(sys.argv) != 5:
        fail("usage: check_hf_shards.py SHARDED_DIR SINGLE_FILE MAX_SHARD_BYTES MIN_FILES")
    d, single, limit, min_files = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if os.path.exists(os.path.join(d, "model.safetensors")):
        fail("model.safetensors next to the shards (transformers would load it instead)")
    with open(os.path.join(d, "model.safetensors.index.json")) as f:
        index = json.load(f)
    wmap = index["weight_map"]
    files = sorted(set(wmap.values()))
    n = len(files)
    if n < min_files:
        fail(f"{n} files, want at least {min_files}")
    want_names = [f"model-{i:05d}-of-{n:05d}.safetensors" for i in range(1, n + 1)]
    if files != want_names:
        fail(f"files {files}, want {want_names}")
    whole = read(single)
    seen, total = {}, 0
    for name in files:
        tensors = read(os.path.join(d, name))
        size = sum(len(t[2]) for t in tensors.values())
        if size > limit and len(tensors) > 1:
            fail(f"{name} holds {size} bytes of {len(tensors)} tensors, over {limit}")
        for k, t in tensors.items():
            if k in seen:
                fail(f"{k} in {seen[k]} and {name}")
            if wmap.get(k) != name:
                fail(f"{k} is in {name}, the index says {wmap.get(k)}")
            if k not in whole or whole[k] != t:
                fail(f"{k} in {name} differs from {single}")
            seen[k] = name
            total += len(t[2])
    if set(seen) != set(whole) or set(wmap) != set(whole):
        fail(f"tensors {sorted(set(whole) - set(seen))} missing")
    if index["metadata"]["total_size"] != total:
        fail(f"total_size {index['metadata']['total_size']}, the tensors hold {total}")
    print(f"ok {n} files")


if __name__ == "__main__":
    main()
