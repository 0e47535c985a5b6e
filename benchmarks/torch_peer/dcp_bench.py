#!/usr/bin/env python3
"""torch.distributed.checkpoint through gradsnap (gradsnap.torch) against DCP's own
FileSystemWriter / FileSystemReader on the same disk, in one run (docs/python.md, "Benchmark";
targets: dcp_save_ratio >= 1.0 and dcp_load_ratio >= 1.0).

    PYTHONPATH=build/python /opt/gradsnap-venv/bin/python benchmarks/torch_peer/dcp_bench.py
        [--bytes 1G] [--tensors 8] [--passes 3] [--dir /tmp]
        [--server build/bin/gradsnap-server | --endpoint HOST:PORT]

One process. The state is --tensors fp32 tensors of random normal values, --bytes in all. Each
pass, in turns:
  filesystem   dcp.save(state, storage_writer=FileSystemWriter(DIR/fs-P)) (it fsyncs its
               files: durable, as gradsnap's save); the page cache dropped (the whole cache as
               root, else the files' pages); dcp.load into a zeroed state of the same shapes
               with FileSystemReader;
  gradsnap     dcp.save with gradsnap.torch.Writer into an embedded store DIR/store, the
               gradsnap-server this program starts from --server (data directory DIR/server,
               loopback, stopped at the end) or the one at --endpoint; durable when it
               returns; then two loads, in turns (which one goes first alternates by pass),
               each after the page cache is dropped: dcp.load with gradsnap.torch.Reader as
               it is (each shard one stream: the load needs all of it) and with
               stream_fraction=2 (every item its own ranged read: the Reader before streams).
All loads are compared with the saved state. Last line: name=value pairs: fs_save_gbps
fs_load_gbps gradsnap_save_gbps gradsnap_load_gbps gradsnap_ranged_load_gbps dcp_save_ratio
(filesystem save time / gradsnap's) dcp_load_ratio (filesystem load time / gradsnap's)
dcp_load_ratio_ranged (the same with ranged reads), medians over the passes.
"""
import argparse
import os
import shutil
import signal
import subprocess
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
    ap.add_argument("--server", default="",
                    help="gradsnap through a gradsnap-server started from this binary on "
                         "loopback, its data directory under --dir. Default: an embedded "
                         "store")
    a = ap.parse_args()
    if a.endpoint and a.server:
        ap.error("--endpoint and --server exclude each other")
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
    server = None
    store = os.path.join(work, "store")  # the files whose pages are dropped before loads
    if a.server:
        store = os.path.join(work, "server")
        log = os.path.join(work, "server.log")
        with open(log, "wb") as f:
            server = subprocess.Popen([a.server, "--data-dir", store, "--listen",
                                       "127.0.0.1:0"], stdout=subprocess.PIPE, stderr=f,
                                      text=True)
        line = server.stdout.readline()
        if not line.startswith("gradsnap-server listening on "):
            server.kill()
            with open(log) as f:
                why = f.read().strip()
            shutil.rmtree(work, ignore_errors=True)
            sys.exit(f"dcp_bench: {a.server} did not start: {why}")
        a.endpoint = line.split()[3]
    elif a.endpoint:
        store = work  # as root the whole cache is dropped; else the server's pages stay
    client = (gradsnap.connect(servers=a.endpoint) if a.endpoint
              else gradsnap.open_dir(store))
    job = f"dcp-bench-{os.getpid()}"
    rows = {k: [] for k in ("fs_save", "fs_load", "gs_save", "gs_load", "gs_ranged_load")}

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
            loads = [("gs_load", {}), ("gs_ranged_load", {"stream_fraction": 2.0})]
            for key, kw in loads if p % 2 == 0 else loads[::-1]:
                drop_cache(store)
                out = {k: torch.zeros_like(v) for k, v in state.items()}
                rows[key].append(timed(lambda: dcp.load(
                    out, storage_reader=gt.Reader(client, job, p, **kw))))
                check(out, f"gradsnap.torch.Reader({kw})")
            client.delete(job, p)
            print(f"pass {p + 1}/{a.passes}: GB/s filesystem save {gb / rows['fs_save'][-1]:.2f} "
                  f"load {gb / rows['fs_load'][-1]:.2f}, gradsnap save "
                  f"{gb / rows['gs_save'][-1]:.2f} load {gb / rows['gs_load'][-1]:.2f} "
                  f"(ranged {gb / rows['gs_ranged_load'][-1]:.2f})", flush=True)
    finally:
        client.close()
        if server is not None:
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=60)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in rows.items()}
    save_ratio = statistics.median(f / g for f, g in zip(rows["fs_save"], rows["gs_save"]))
    load_ratio = statistics.median(f / g for f, g in zip(rows["fs_load"], rows["gs_load"]))
    ranged_ratio = statistics.median(
        f / g for f, g in zip(rows["fs_load"], rows["gs_ranged_load"]))
    print(f"bytes={nbytes} passes={a.passes} "
          f"fs_save_gbps={gb / med['fs_save']:.3f} fs_load_gbps={gb / med['fs_load']:.3f} "
          f"gradsnap_save_gbps={gb / med['gs_save']:.3f} "
          f"gradsnap_load_gbps={gb / med['gs_load']:.3f} "
          f"gradsnap_ranged_load_gbps={gb / med['gs_ranged_load']:.3f} "
          f"dcp_save_ratio={save_ratio:.3f} dcp_load_ratio={load_ratio:.3f} "
          f"dcp_load_ratio_ranged={ranged_ratio:.3f}")


if __name__ == "__main__":
    main()
