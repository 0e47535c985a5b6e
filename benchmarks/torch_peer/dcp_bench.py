#!/usr/bin/env python3
"""torch.distributed.checkpoint through gradsnap (gradsnap.torch) against DCP's own
FileSystemWriter / FileSystemReader on the same disk, in one run (docs/python.md, "Benchmark";
targets: dcp_save_ratio >= 1.0 and dcp_load_ratio >= 1.0).

    PYTHONPATH=build/python /opt/gradsnap-venv/bin/python benchmarks/torch_peer/dcp_bench.py
        [--bytes 1G] [--tensors 8] [--passes 3] [--dir /tmp] [--endpoint HOST:PORT]

One process. The state is --tensors fp32 tensors of random normal values, --bytes in all. Each
pass, in turns:
  filesystem   dcp.save(state, storage_writer=FileSystemWriter(DIR/fs-P)) (it fsyncs its
               files: durable, as gradsnap's save); the page cache dropped (the whole cache as
               root, else the files' pages); dcp.load into a zeroed state of the same shapes
               with FileSystemReader;
  gradsnap     dcp.save with gradsnap.torch.Writer into an embedded store DIR/store (or the
               gradsnap-server at --endpoint), durable when it returns; the page cache dropped;
               dcp.load with gradsnap.torch.Reader.
Both loads are compared with the saved state. Last line: name=value pairs: fs_save_gbps
fs_load_gbps gradsnap_save_gbps gradsnap_load_gbps dcp_save_ratio (filesystem save time /
gradsnap's) dcp_load_ratio (filesystem load time / gradsnap's), medians over the passes.
"""
import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_bench import add_state_args, drop_cache, parse_bytes  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_state_args(ap)  # --dir: a temporary directory is made in it and removed at the end
    ap.add_argument("--endpoint", default="",
                    help="gradsnap through this gradsnap-server. Default: an embedded store")
    a = ap.parse_args()
    total = parse_bytes(a.bytes)
    if not 1 <= a.passes <= 20 or a.tensors < 1 or total < a.tensors * 4:
        ap.error("--passes must be 1..20, --tensors >= 1 and --bytes at least 4 per tensor")
    warnings.filterwarnings("ignore")  # DCP's "no process group: single process" warnings
    import torch
    import torch.distributed.checkpoint as dcp
    import gradsnap
    import gradsnap.torch as gt

    torch.set_num_threads(1)
    per = total // a.tensors // 4
    g = torch.Generator().manual_seed(1)
    state = {f"t{i}": torch.randn(per, generator=g) for i in range(a.tensors)}
    nbytes = per * 4 * a.tensors
    gb = nbytes / 1e9
    work = tempfile.mkdtemp(prefix="dcp-bench-", dir=a.dir)
    client = (gradsnap.connect(servers=a.endpoint) if a.endpoint
              else gradsnap.open_dir(os.path.join(work, "store")))
    job = f"dcp-bench-{os.getpid()}"
    rows = {k: [] for k in ("fs_save", "fs_load", "gs_save", "gs_load")}

    def timed(f):
        t = time.perf_counter()
        f()
        return time.perf_counter() - t

    def check(loaded, what):
        for k, v in state.items():
            if not torch.equal(loaded[k], v):
                sys.exit(f"dcp_bench: {what} loaded {k} wrong")

    try:
        for p in range(a.passes):
            path = os.path.join(work, f"fs-{p}")
            rows["fs_save"].append(timed(lambda: dcp.save(
                state, storage_writer=dcp.FileSystemWriter(path))))
            drop_cache(path)
            out = {k: torch.zeros_like(v) for k, v in state.items()}
            rows["fs_load"].append(timed(lambda: dcp.load(
                out, storage_reader=dcp.FileSystemReader(path))))
            check(out, "FileSystemReader")
            shutil.rmtree(path)
            rows["gs_save"].append(timed(lambda: dcp.save(
                state, storage_writer=gt.Writer(client, job, p))))
            if not a.endpoint:
                drop_cache(os.path.join(work, "store"))
            out = {k: torch.zeros_like(v) for k, v in state.items()}
            rows["gs_load"].append(timed(lambda: dcp.load(
                out, storage_reader=gt.Reader(client, job, p))))
            check(out, "gradsnap.torch.Reader")
            client.delete(job, p)
            print(f"pass {p + 1}/{a.passes}: GB/s filesystem save {gb / rows['fs_save'][-1]:.2f} "
                  f"load {gb / rows['fs_load'][-1]:.2f}, gradsnap save "
                  f"{gb / rows['gs_save'][-1]:.2f} load {gb / rows['gs_load'][-1]:.2f}",
                  flush=True)
    finally:
        client.close()
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    save_ratio = statistics.median(f / g for f, g in zip(rows["fs_save"], rows["gs_save"]))
    load_ratio = statistics.median(f / g for f, g in zip(rows["fs_load"], rows["gs_load"]))
    print(f"bytes={nbytes} passes={a.passes} "
          f"fs_save_gbps={gb / med['fs_save']:.3f} fs_load_gbps={gb / med['fs_load']:.3f} "
          f"gradsnap_save_gbps={gb / med['gs_save']:.3f} "
          f"gradsnap_load_gbps={gb / med['gs_load']:.3f} "
          f"dcp_save_ratio={save_ratio:.3f} dcp_load_ratio={load_ratio:.3f}")


if __name__ == "__main__":
    main()
