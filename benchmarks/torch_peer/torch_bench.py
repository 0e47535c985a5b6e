#!/usr/bin/env python3
"""gradsnap vs PyTorch's own checkpointing on the same bytes, in one run (DESIGN.md section 7:
save and load vs torch.save + fsync / torch.load (cold), targets >= 1.5x / >= 1.1x).

    python3 benchmarks/torch_peer/torch_bench.py [--bytes 1G] [--tensors 8] [--passes 3]
        [--dir /tmp] [--io build/bin/gradsnap_peer_io] [--endpoint HOST:PORT]

Needs PyTorch (a venv: python3 -m venv V && V/bin/pip install torch; docs/build.md). The state
is --tensors fp32 tensors of random normal values, --bytes in all. Each pass, in turns:
  torch save      torch.save(dict of tensors, file), flush, os.fsync: durable, as gradsnap's save;
  torch load      page cache dropped (the whole cache as root, else the file's pages), then
                  torch.load(file, weights_only=True), which reads into fresh tensors;
  gradsnap        gradsnap_peer_io (build/bin), one process through every pass as this one is
                  for torch: SaveShard of the same bytes (the raw tensors torch_bench wrote,
                  read into memory untimed), durable; page cache dropped; RestoreTensor of each
                  tensor into memory allocated for it then; the bytes compared.
Loaded and restored bytes are both checked against the saved tensors.

Last line: name=value pairs: torch_save_gbps torch_load_gbps gradsnap_save_gbps
gradsnap_restore_gbps save_speedup (torch save time / gradsnap's, target >= 1.5) load_speedup
(torch load time / gradsnap restore time, target >= 1.1), medians over the passes.
"""
import argparse
import ctypes
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings


def parse_bytes(s):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    s = s.strip().upper().removesuffix("IB").removesuffix("B")
    if s and s[-1] in units:
        return int(float(s[:-1]) * units[s[-1]])
    return int(s)


def drop_cache(path):
    """The whole page cache as root (what a cold torch.load sees), else the file's pages."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return
    except OSError:
        pass
    for root, _, files in os.walk(path) if os.path.isdir(path) else [("", None, [path])]:
        for name in files:
            p = os.path.join(root, name)
            fd = os.open(p, os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def add_state_args(ap):
    """--bytes, --tensors, --passes and --dir, shared with dcp_bench.py."""
    ap.add_argument("--bytes", default="1G", help="state size (K/M/G suffixes). Default: 1G")
    ap.add_argument("--tensors", type=int, default=8, help="tensors in the state. Default: 8")
    ap.add_argument("--passes", type=int, default=3, help="passes (1..20). Default: 3")
    ap.add_argument("--dir", default="/tmp", help="scratch directory on the disk under test. "
                    "Default: /tmp")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_state_args(ap)
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--io", default=os.path.join(here, "..", "..", "build", "bin",
                                                 "gradsnap_peer_io"),
                    help="the gradsnap_peer_io binary. Default: build/bin/gradsnap_peer_io")
    ap.add_argument("--endpoint", default="",
                    help="save to / restore from this gradsnap-server. Default: an embedded store")
    a = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*NumPy.*")  # torch without numpy: not needed
    try:
        import torch
    except ImportError:
        sys.exit("torch_bench: PyTorch is not installed: python3 -m venv V && "
                 "V/bin/pip install torch, then run this with V/bin/python3")
    try:
        total = parse_bytes(a.bytes) // 4 // max(1, a.tensors) * 4 * a.tensors
    except ValueError:
        sys.exit(f"torch_bench: --bytes {a.bytes}: not a size (e.g. 256M, 1G)")
    if total <= 0 or a.tensors <= 0 or not 1 <= a.passes <= 20:
        sys.exit("torch_bench: --bytes, --tensors must be positive, --passes 1..20")
    if not os.access(a.io, os.X_OK):
        sys.exit(f"torch_bench: {a.io} is not built (cmake --build build --target "
                 "gradsnap_peer_io)")
    numel = total // 4 // a.tensors
    torch.manual_seed(0)
    state = {f"t{i}": torch.randn(numel, dtype=torch.float32) for i in range(a.tensors)}
    scratch = tempfile.mkdtemp(prefix="torch_bench-", dir=a.dir)
    try:
        raw = os.path.join(scratch, "state.raw")
        with open(raw, "wb") as f:
            for t in state.values():  # the tensors' bytes (no numpy needed)
                f.write(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()))
        spec = ",".join(f"{k}:{numel}" for k in state)
        gb = total / 1e9
        rows = {"torch_save": [], "torch_load": [], "gradsnap_save": [], "gradsnap_restore": []}

        def torch_pass(p):
            path = os.path.join(scratch, f"state{p}.pt")
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            rows["torch_save"].append(time.perf_counter() - t0)
            drop_cache(path)
            t0 = time.perf_counter()
            loaded = torch.load(path, weights_only=True)
            rows["torch_load"].append(time.perf_counter() - t0)
            if any(not torch.equal(loaded[k], state[k]) for k in state):
                sys.exit("torch_bench: torch.load returned other bytes")
            del loaded
            os.remove(path)

        work = os.path.join(scratch, "gs")
        os.makedirs(work)
        cmd = [a.io, "--raw", raw, "--tensors", spec, "--dir", work]
        if a.endpoint:
            cmd += ["--endpoint", a.endpoint]
        peer = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

        def gradsnap_pass(p):
            peer.stdin.write(f"{p + 1}\n")
            peer.stdin.flush()
            line = peer.stdout.readline()
            if not line:
                peer.kill()
                sys.exit(f"torch_bench: gradsnap_peer_io failed: {peer.stderr.read().strip()}")
            kv = dict(x.split("=") for x in line.split())
            rows["gradsnap_save"].append(float(kv["gradsnap_save_s"]))
            rows["gradsnap_restore"].append(float(kv["gradsnap_restore_s"]))

        for p in range(a.passes):
            order = (torch_pass, gradsnap_pass) if p % 2 == 0 else (gradsnap_pass, torch_pass)
            for f in order:
                f(p)
            print(f"pass {p + 1}/{a.passes}: GB/s torch save {gb / rows['torch_save'][-1]:.2f} "
                  f"load {gb / rows['torch_load'][-1]:.2f} | gradsnap save "
                  f"{gb / rows['gradsnap_save'][-1]:.2f} restore "
                  f"{gb / rows['gradsnap_restore'][-1]:.2f}", flush=True)
        peer.stdin.close()
        if peer.wait() != 0:
            sys.exit(f"torch_bench: gradsnap_peer_io failed: {peer.stderr.read().strip()}")
        med = {k: statistics.median(v) for k, v in rows.items()}
        save_speedup = statistics.median(
            t / g for t, g in zip(rows["torch_save"], rows["gradsnap_save"]))
        load_speedup = statistics.median(
            t / g for t, g in zip(rows["torch_load"], rows["gradsnap_restore"]))
        print(f"state {total / (1 << 30):.2f} GiB in {a.tensors} fp32 tensors, {a.passes} "
              f"passes (medians), torch {torch.__version__}, gradsnap "
              f"{'server ' + a.endpoint if a.endpoint else 'embedded store'} in {a.dir}")
        print(f"bytes={total} passes={a.passes} "
              f"torch_save_gbps={gb / med['torch_save']:.3f} "
              f"torch_load_gbps={gb / med['torch_load']:.3f} "
              f"gradsnap_save_gbps={gb / med['gradsnap_save']:.3f} "
              f"gradsnap_restore_gbps={gb / med['gradsnap_restore']:.3f} "
              f"save_speedup={save_speedup:.3f} load_speedup={load_speedup:.3f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
