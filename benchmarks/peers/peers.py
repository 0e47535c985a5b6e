#!/usr/bin/env python3
"""gradsnap against what a PyTorch user would pick instead (torch.save, torch.distributed.checkpoint
save / async_save, torchsnapshot), on I/O, training stall, trainer speed and a flipped byte, in
one run on one disk (docs/performance.md). Run it through benchmarks/peers/run.sh, which makes the
venv and builds nothing: it needs build/bin/gradsnap-server, build/bin/gradsnap-train and the
Python package in build/python.

    peers.py [--quick] [--sizes 256M,1G] [--small-count 20000] [--small-bytes 256M] [--reps 3]
             [--sections io,ws2,flip,train,speed] [--model small] [--steps 30] [--every 10]
             [--train-threads 2] [--speed-threads 1,2] [--dir /var/tmp] [--build build]
             [--out FILE]

Every result is one JSON line on stdout (and in --out): {"section": ..., ...}. The last line is
{"section": "figures", ...} with save_speedup_vs_torch, load_speedup_vs_torch,
load_speedup_vs_dcp, stall_ratio_vs_dcp_async, trainer_speed_vs_torch_t1/_t2 and their targets.
Sections:
  io     per state (each --sizes entry as 8 large fp32 tensors, and --small-count tensors of
         --small-bytes in all), --reps passes; each pass runs every system in a rotated order:
         save until durable (torch.save + fsync; DCP's FileSystemWriter fsyncs its files;
         async_save: the blocking call, then until its future is done; torchsnapshot: take, then
         fsync of its files; gradsnap: Client.save returns once durable), the whole page cache
         dropped (echo 3 > /proc/sys/vm/drop_caches, as root), a load into fresh memory, and a
         comparison with the saved tensors. Also the CPU-seconds (user + system of this process
         and of the gradsnap-server) of each save and load.
  ws2    a checkpoint saved by 1 process, loaded by 2 (Gloo on loopback, each rank its half of
         every tensor as a DTensor Shard(0)), by DCP's FileSystemReader and by gradsnap.torch's
         Reader through a gradsnap-server; the smallest --sizes state.
  flip   a 4 MiB state saved by each system, one byte 5/8 into its largest data file (inside a
         tensor's bytes) flipped, the page cache dropped, a load: "error" (and its first line) or "silent"
         (the load returned other values) or "unchanged" (it returned the saved values).
  train  the same GPT shape (--model, batch 8 x 128) trained --steps steps by PyTorch
         (benchmarks/trainer_throughput/torch_gpt.py's model) with each checkpointer every
         --every steps, and by gradsnap-train in each --ckpt-mode; per step its time and the
         stall (time inside the checkpointer; for async checkpointers the blocking call plus
         any wait for the previous one); the stall per checkpoint is, as snapshot_bench
         counts it, the steps' stall over the checkpoints completed during training (a gockpt
         window the run's end cut short is left out: it is finished after the last step);
         stall_ms_per_ckpt_with_end adds the end's wait, over every checkpoint started
         (gradsnap-train: its Finish and the drain that stores its last checkpoints;
         async_save and torchsnapshot's async_take: the wait on their last future). Also
         with --model tiny, for the stall against the state size.
  speed  tokens/s of both trainers without checkpoints at each --speed-threads count,
         --reps rounds, alternating which goes first.
"""
import argparse
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "trainer_throughput"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks", "torch_peer"))

TARGETS = {"save_speedup_vs_torch": ">= 1.5", "load_speedup_vs_torch": ">= 1.1",
           "load_speedup_vs_dcp": ">= 1.1", "stall_ratio_vs_dcp_async": "<= 0.10",
           "trainer_speed_vs_torch_t1": ">= 0.80", "trainer_speed_vs_torch_t2": ">= 0.80"}
OUT = None
RECORDS = []


def emit(rec):
    RECORDS.append(rec)
    line = json.dumps(rec, sort_keys=False)
    print(line, flush=True)
    if OUT:
        OUT.write(line + "\n")
        OUT.flush()


def parse_bytes(s):
    from torch_bench import parse_bytes as pb
    return pb(s)


def drop_cache():
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


def fsync_tree(path):
    for root, _, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def cpu_seconds(pids=()):
    """User + system CPU seconds of this process (all threads) and of `pids` (from /proc)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    total = r.ru_utime + r.ru_stime
    tick = os.sysconf("SC_CLK_TCK")
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick
        except OSError:
            pass
    return total


class Server:
    """A real gradsnap-server on loopback (python/tests/gsutil.py's), the RAM tier off so a
    restore reads the disk."""

    def __init__(self, build, data_dir):
        os.environ["GRADSNAP_SERVER_BIN"] = os.path.join(build, "bin", "gradsnap-server")
        sys.path.insert(0, os.path.join(ROOT, "python", "tests"))
        self.data_dir = data_dir
        self.proc = None
        self.addr = None

    def start(self):
        import gsutil
        self.server = gsutil.Server(self.data_dir, ["--cache-bytes", "0"])
        self.proc, self.addr = self.server.proc, self.server.address
        return self

    def stop(self):
        if self.proc:
            self.server.stop()
        self.proc = None


# ---------------------------------------------------------------------------- the systems
# Each: save(state, where, step) -> (blocking_s, durable_s); load(where, step, template) ->
# {name: tensor}; files(where, step) -> the directory holding its bytes (for the flipped byte).

class TorchSave:
    name = "torch_save"

    def save(self, state, where, step):
        import torch
        t0 = time.perf_counter()
        with open(os.path.join(where, f"s{step}.pt"), "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        d = time.perf_counter() - t0
        return d, d

    def load(self, where, step, template):
        import torch
        return torch.load(os.path.join(where, f"s{step}.pt"), weights_only=True)

    def files(self, where, step):
        return [os.path.join(where, f"s{step}.pt")]


class Dcp:
    name = "dcp_save"

    def save(self, state, where, step):
        import torch.distributed.checkpoint as dcp
        t0 = time.perf_counter()
        dcp.save(state, storage_writer=dcp.FileSystemWriter(os.path.join(where, f"d{step}")))
        d = time.perf_counter() - t0
        return d, d

    def load(self, where, step, template):
        import torch
        import torch.distributed.checkpoint as dcp
        out = {k: torch.empty_like(v) for k, v in template.items()}
        dcp.load(out, storage_reader=dcp.FileSystemReader(os.path.join(where, f"d{step}")))
        return out

    def files(self, where, step):
        d = os.path.join(where, f"d{step}")
        return [os.path.join(d, n) for n in os.listdir(d) if n.endswith(".distcp")]


class DcpAsync(Dcp):
    name = "dcp_async_save"

    def save(self, state, where, step):
        import torch.distributed.checkpoint as dcp
        t0 = time.perf_counter()
        fut = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(
            os.path.join(where, f"d{step}")))
        b = time.perf_counter() - t0
        fut.result()
        return b, time.perf_counter() - t0


class TorchSnapshot:
    name = "torchsnapshot"

    def save(self, state, where, step):
        import torchsnapshot
        path = os.path.join(where, f"ts{step}")
        t0 = time.perf_counter()
        torchsnapshot.Snapshot.take(path=path, app_state={"s": torchsnapshot.StateDict(**state)})
        fsync_tree(path)  # take() does not fsync: durable, as the others
        d = time.perf_counter() - t0
        return d, d

    def load(self, where, step, template):
        import torch
        import torchsnapshot
        out = torchsnapshot.StateDict(**{k: torch.empty_like(v) for k, v in template.items()})
        torchsnapshot.Snapshot(path=os.path.join(where, f"ts{step}")).restore(
            app_state={"s": out})
        return dict(out)

    def files(self, where, step):
        out = []
        for root, _, names in os.walk(os.path.join(where, f"ts{step}")):
            out += [os.path.join(root, n) for n in names if not n.startswith(".")]
        return out


class Gradsnap:
    """gradsnap's Python client (the C++ library): embedded store, or a gradsnap-server."""

    def __init__(self, client, name, data_dir, restart=None):
        self.c, self.name, self.data_dir, self.restart = client, name, data_dir, restart

    def save(self, state, where, step):
        t0 = time.perf_counter()
        self.c.save("peers", step, {k: v.numpy() for k, v in state.items()})
        d = time.perf_counter() - t0
        return d, d

    def load(self, where, step, template):
        """Client.restore (tensor by tensor, each into a new array) for a state of at most 64
        tensors; beyond that the shard's payload in one verified ranged read, the tensors views
        of it (as gradsnap.torch's Reader reads): through a server, restore re-reads a chunk
        shared by many small tensors once per tensor (docs/performance.md)."""
        import numpy as np
        import torch
        if len(template) <= 64:
            return {k: torch.from_numpy(v) for k, v in self.c.restore("peers", step).items()}
        shard = next(s for s in self.c.show("peers", step)["shards"] if s["rank"] == 0)
        buf = self.c.read_range("peers", step, 0, 0, shard["raw_bytes"])
        out, off = {}, 0
        for t in shard["tensors"]:
            n = t["byte_length"]
            out[t["name"]] = torch.from_numpy(buf[off:off + n].view(np.float32)).view(t["shape"])
            off += n
        return out

    def drop(self, step):
        self.c.delete("peers", step)

    def files(self, where, step):
        """The segment files (chunk records; the rest is RocksDB's catalog)."""
        out = []
        for root, _, names in os.walk(self.data_dir):
            out += [os.path.join(root, n) for n in names if n.endswith(".seg")]
        return out


def make_state(total, count, seed=1):
    import torch
    per = max(1, total // count // 4)
    g = torch.Generator().manual_seed(seed)
    return {f"t{i:05d}": torch.randn(per, generator=g) for i in range(count)}


def same(a, b):
    import torch
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def io_section(a, systems, server_pids):
    states = [(s, 8, "large") for s in a.sizes]
    if a.small_count:
        states.append((a.small_bytes, a.small_count, "small"))
    for total, count, layout in states:
        state = make_state(total, count)
        nbytes = sum(v.numel() * 4 for v in state.values())
        for rep in range(a.reps):
            k = rep % len(systems)
            for sysm in systems[k:] + systems[:k]:
                where = tempfile.mkdtemp(prefix=f"{sysm.name}-", dir=a.dir)
                step = rep + 1
                drop_cache()
                c0 = cpu_seconds(server_pids)
                blocking, durable = sysm.save(state, where, step)
                c1 = cpu_seconds(server_pids)
                drop_cache()
                c2 = cpu_seconds(server_pids)
                t0 = time.perf_counter()
                out = sysm.load(where, step, state)
                load_s = time.perf_counter() - t0
                c3 = cpu_seconds(server_pids)
                ok = same(out, state)
                del out
                if hasattr(sysm, "drop"):
                    sysm.drop(step)
                shutil.rmtree(where, ignore_errors=True)
                emit({"section": "io", "system": sysm.name, "layout": layout, "tensors": count,
                      "bytes": nbytes, "rep": rep, "save_blocking_s": round(blocking, 4),
                      "save_durable_s": round(durable, 4), "load_cold_s": round(load_s, 4),
                      "save_cpu_s": round(c1 - c0, 3), "load_cpu_s": round(c3 - c2, 3),
                      "exact": ok, "load_api": ("" if not isinstance(sysm, Gradsnap) else
                                                "restore" if count <= 64 else "read_range")})
                if not ok:
                    sys.exit(f"peers: {sysm.name} loaded other values")
        del state


# ---------------------------------------------------------------------------- ws2 (2 ranks)

def ws2_worker(kind, where, total, count, addr):
    """One of 2 ranks: dcp.load of a 1-process checkpoint into DTensors Shard(0)."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (2,))
    full = make_state(total, count)
    out = {k: distribute_tensor(torch.zeros_like(v), mesh, [Shard(0)]) for k, v in full.items()}
    if kind == "gradsnap":
        import gradsnap
        import gradsnap.torch as gt
        client = gradsnap.connect(servers=addr)
        reader = gt.Reader(client, "peers-ws2", 1)
    else:
        reader = dcp.FileSystemReader(where)
    dist.barrier()
    t0 = time.perf_counter()
    dcp.load(out, storage_reader=reader)
    dist.barrier()
    secs = time.perf_counter() - t0
    ok = all(torch.equal(out[k].to_local(), torch.chunk(v, 2)[dist.get_rank()])
             for k, v in full.items())
    flags = torch.tensor([int(ok)])
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    if dist.get_rank() == 0:
        print(json.dumps({"load_s": secs, "exact": bool(flags.item())}), flush=True)
    dist.destroy_process_group()


def ws2_section(a, server):
    import torch.distributed.checkpoint as dcp
    import gradsnap
    import gradsnap.torch as gt
    total = min(a.sizes)
    state = make_state(total, 8)
    nbytes = sum(v.numel() * 4 for v in state.values())
    client = gradsnap.connect(servers=server.addr)
    for rep in range(a.reps):
        for kind in (("dcp", "gradsnap") if rep % 2 == 0 else ("gradsnap", "dcp")):
            where = tempfile.mkdtemp(prefix="ws2-", dir=a.dir)
            if kind == "dcp":
                dcp.save(state, storage_writer=dcp.FileSystemWriter(where))
            else:
                dcp.save(state, storage_writer=gt.Writer(client, "peers-ws2", 1))
            drop_cache()
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            procs = []
            for r in range(2):
                env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                           MASTER_PORT=str(port), LOCAL_RANK=str(r))
                procs.append(subprocess.Popen(
                    [sys.executable, __file__, "--ws2-worker", kind, where, str(total), "8",
                     server.addr], env=env, stdout=subprocess.PIPE, text=True))
            outs = [p.communicate(timeout=1800)[0] for p in procs]
            if kind == "gradsnap":
                client.delete("peers-ws2", 1)
            shutil.rmtree(where, ignore_errors=True)
            if any(p.returncode for p in procs):
                sys.exit(f"peers: the 2-rank {kind} load failed")
            r = json.loads(outs[0].strip().splitlines()[-1])
            emit({"section": "ws2", "system": "dcp_fs" if kind == "dcp" else "gradsnap_server_dcp",
                  "bytes": nbytes, "rep": rep, "saved_world_size": 1, "load_world_size": 2,
                  "load_cold_s": round(r["load_s"], 4), "exact": r["exact"]})
            if not r["exact"]:
                sys.exit(f"peers: the 2-rank {kind} load returned other values")
    client.close()


# ---------------------------------------------------------------------------- flipped byte

def flip_section(a, systems, server):
    state = make_state(4 << 20, 4, seed=7)
    for sysm in systems:
        where = tempfile.mkdtemp(prefix=f"flip-{sysm.name}-", dir=a.dir)
        step = 1000
        before = time.time() - 1
        sysm.save(state, where, step)
        files = [f for f in sysm.files(where, step)
                 if os.path.getsize(f) > 0 and os.path.getmtime(f) >= before]
        target = max(files, key=os.path.getsize)
        size = os.path.getsize(target)
        off = size * 5 // 8  # inside a tensor's data, past any per-item header
        with open(target, "r+b") as f:
            f.seek(off)
            b = f.read(1)
            f.seek(off)
            f.write(bytes([b[0] ^ 0x01]))
            f.flush()
            os.fsync(f.fileno())
        if getattr(sysm, "restart", None):
            sysm.restart()
        drop_cache()
        try:
            out = sysm.load(where, step, state)
            outcome, detail = ("unchanged" if same(out, state) else "silent"), ""
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - the result (DCP's is a BaseException)
            lines = [x.strip() for x in str(e).strip().splitlines() if x.strip()] or [""]
            outcome, detail = "error", f"{type(e).__name__}: {lines[-1][:200]}"
        if hasattr(sysm, "drop"):
            try:
                sysm.drop(step)
            except Exception:  # noqa: BLE001
                pass
        shutil.rmtree(where, ignore_errors=True)
        emit({"section": "flip", "system": sysm.name, "file": os.path.basename(target),
              "file_bytes": size, "offset": off, "outcome": outcome, "detail": detail})


# ---------------------------------------------------------------------------- training

def flat_state(model, opt):
    """Parameters and AdamW state as one flat {name: tensor} (every checkpointer gets this)."""
    out = {f"model.{k}": v for k, v in model.state_dict().items()}
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if hasattr(v, "numel"):
                out[f"optim.{names[id(p)]}.{k}"] = v if v.dim() else v.reshape(1)
    return out


def train_worker(mode, model_name, steps, every, threads, batch, seq, where):
    """PyTorch training the GPT of torch_gpt.py with checkpointer `mode` every `every` steps;
    prints one JSON line (per-step times and stalls)."""
    import torch
    from torch_gpt import setup, train_step
    warnings.filterwarnings("ignore")
    model, opt, data = setup(model_name, threads, steps, batch, seq)
    pending = None
    client = None
    if mode == "gradsnap_py":
        import gradsnap
        client = gradsnap.open_dir(os.path.join(where, "store"))
    step_ms, stall_ms = [], []
    state_bytes = 0
    for s in range(steps):
        t0 = time.perf_counter()
        train_step(model, opt, data[s])
        stall = 0.0
        if mode != "none" and (s + 1) % every == 0:
            c0 = time.perf_counter()
            state = flat_state(model, opt)
            state_bytes = sum(v.numel() * v.element_size() for v in state.values())
            path = os.path.join(where, f"ck{s + 1}")
            if mode == "torch_save":
                with open(path, "wb") as f:
                    torch.save(state, f)
                    f.flush()
                    os.fsync(f.fileno())
            elif mode == "dcp_save":
                import torch.distributed.checkpoint as dcp
                dcp.save(state, storage_writer=dcp.FileSystemWriter(path))
            elif mode == "dcp_async_save":
                import torch.distributed.checkpoint as dcp
                if pending is not None:
                    pending.result()
                pending = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(path))
            elif mode == "torchsnapshot":
                import torchsnapshot
                torchsnapshot.Snapshot.take(path=path,
                                            app_state={"s": torchsnapshot.StateDict(**state)})
                fsync_tree(path)
            elif mode == "torchsnapshot_async":
                import torchsnapshot
                if pending is not None:
                    pending.wait()
                pending = torchsnapshot.Snapshot.async_take(
                    path=path, app_state={"s": torchsnapshot.StateDict(**state)})
            elif mode == "gradsnap_py":
                client.save("train", s + 1, {k: v.detach().numpy() for k, v in state.items()})
            stall = time.perf_counter() - c0
        step_ms.append(1000 * (time.perf_counter() - t0))
        stall_ms.append(1000 * stall)
    e0 = time.perf_counter()  # the end's wait: the last async checkpoint stored
    if pending is not None:
        pending.result() if hasattr(pending, "result") else pending.wait()
    if client:
        client.close()
    end_ms = 1000 * (time.perf_counter() - e0)
    total = sum(step_ms) / 1000
    print(json.dumps({"step_ms": step_ms, "stall_ms": stall_ms, "state_bytes": state_bytes,
                      "end_ms": end_ms, "tokens_per_s": steps * batch * seq / total}),
          flush=True)


def seq_for(a, model):
    """--seq, at most the model's context (tiny: 32)."""
    from torch_gpt import MODELS
    return min(a.seq, MODELS[model][0])


def run_torch_train(a, mode, model, steps, every, threads):
    where = tempfile.mkdtemp(prefix=f"train-{mode}-", dir=a.dir)
    try:
        p = subprocess.run([sys.executable, __file__, "--train-worker", mode, model, str(steps),
                            str(every), str(threads), str(a.batch), str(seq_for(a, model)), where],
                           capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            sys.exit(f"peers: PyTorch trainer ({mode}) failed: {p.stderr.strip()[-800:]}")
        return json.loads(p.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(where, ignore_errors=True)


def run_gradsnap_train(a, mode, model, steps, every, threads):
    """gradsnap-train (--ckpt-mode from `mode`, "gockpt+gradlog" adds --grad_log), one rank."""
    where = tempfile.mkdtemp(prefix=f"gstrain-{mode}-", dir=a.dir)
    ckmode = mode.split("+")[0]
    cmd = [os.path.join(a.build, "bin", "gradsnap-train"), "--model", model, "--steps",
           str(steps), "--batch", str(a.batch), "--seq", str(seq_for(a, model)), "--blas-threads",
           str(threads), "--ckpt-mode", ckmode]
    if ckmode != "none":
        cmd += ["--ckpt-every", str(every), "--ckpt-dir", os.path.join(where, "ck")]
    if mode.endswith("+gradlog"):
        cmd += ["--grad_log"]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            sys.exit(f"peers: {' '.join(cmd)} failed: {(p.stdout + p.stderr).strip()[-800:]}")
        step_ms, stall_ms, summ, ck = [], [], {}, {}
        for line in p.stdout.splitlines():
            w = line.split()
            if w and w[0] == "step" and "step_ms" in w:
                step_ms.append(float(w[w.index("step_ms") + 1]))
                stall_ms.append(float(w[w.index("stall_ms") + 1]))
            elif w and w[0] == "summary":
                summ = dict(x.split("=", 1) for x in w[1:] if "=" in x)
            elif w[:2] == ["ckpt", "summary"]:
                ck = dict(x.split("=", 1) for x in w[2:] if "=" in x)
        finish_ms = float(ck.get("finish_ms", 0))
        return {"step_ms": step_ms, "stall_ms": stall_ms, "finish_ms": finish_ms,
                # the end's wait: Finish, then the last checkpoints stored (the sink's drain)
                "end_ms": finish_ms + float(ck.get("drain_ms", 0)),
                "cut_short": int(ck.get("cut_short", 0)),
                "state_bytes": 12 * int(summ.get("params", 0)),
                "tokens_per_s": float(summ["tokens_per_s"])}
    finally:
        shutil.rmtree(where, ignore_errors=True)


TORCH_MODES = ["none", "torch_save", "dcp_save", "dcp_async_save", "torchsnapshot",
               "torchsnapshot_async", "gradsnap_py"]
GS_MODES = ["none", "sync", "async", "gockpt", "gockpt+gradlog"]


def train_section(a):
    for model in a.train_models:
        runs = [(t, m) for t, modes in (("pytorch", TORCH_MODES), ("gradsnap-train", GS_MODES))
                if t in a.train_trainers for m in modes]
        if a.quick:  # CI: one async checkpointer of each trainer against none
            runs = [r for r in runs if r[1] in ("none", "dcp_async_save", "gockpt+gradlog")]
        for rep in range(a.train_reps):
            base = {}
            order = runs if rep % 2 == 0 else runs[::-1]
            for trainer, mode in order:
                f = run_torch_train if trainer == "pytorch" else run_gradsnap_train
                r = f(a, mode, model, a.steps, a.every, a.train_threads)
                # As snapshot_bench counts it: the steps' stall over the checkpoints completed
                # during training (a gockpt window the run's end cut short is finished after
                # the last step, so it is left out); with_end: also the end's wait (gradsnap:
                # Finish and the last checkpoints stored; an async PyTorch checkpointer: its
                # last future), over every checkpoint started.
                fulls = a.steps // a.every
                done = max(1, fulls - r.get("cut_short", 0))
                rec = {"section": "train", "trainer": trainer, "mode": mode, "model": model,
                       "rep": rep, "threads": a.train_threads, "steps": a.steps,
                       "every": a.every, "state_bytes": r["state_bytes"],
                       "tokens_per_s": round(r["tokens_per_s"], 1),
                       "stall_ms_per_ckpt": (round(sum(r["stall_ms"]) / done, 2)
                                             if mode != "none" else 0.0),
                       "stall_ms_per_ckpt_with_end": (
                           round((sum(r["stall_ms"]) + r.get("end_ms", 0)) / fulls, 2)
                           if mode != "none" else 0.0),
                       "finish_ms": r.get("finish_ms", 0.0),
                       "end_ms": round(r.get("end_ms", 0.0), 1),
                       "cut_short": r.get("cut_short", 0),
                       "step_ms": [round(x, 1) for x in r["step_ms"]],
                       "stall_ms": [round(x, 1) for x in r["stall_ms"]]}
                emit(rec)
                base[(trainer, mode)] = rec


def speed_section(a):
    for rep in range(a.reps):
        for t in a.speed_threads:
            pair = [("gradsnap-train", run_gradsnap_train), ("pytorch", run_torch_train)]
            if rep % 2:
                pair.reverse()
            got = {}
            for trainer, f in pair:
                got[trainer] = f(a, "none", a.model, a.speed_steps, 1, t)["tokens_per_s"]
            emit({"section": "speed", "rep": rep, "threads": t, "model": a.model,
                  "gradsnap_tokens_per_s": round(got["gradsnap-train"], 1),
                  "torch_tokens_per_s": round(got["pytorch"], 1),
                  "ratio": round(got["gradsnap-train"] / got["pytorch"], 3)})


# ---------------------------------------------------------------------------- figures

def figures(records, a):
    def med(xs):
        return round(statistics.median(xs), 3) if xs else None

    def io_ratio(peer, ours, field_p, field_o, nbytes, best=False):
        """Median over passes of peer time / ours, the large-tensor state of `nbytes`; best:
        the ratio of each side's least time (storage_bench's statistic, docs/build.md)."""
        by = {}
        for r in records:
            if r["section"] == "io" and r["layout"] == "large" and r["bytes"] == nbytes:
                by.setdefault((r.get("run", 0), r["rep"]), {})[r["system"]] = r
        pairs = [(p[peer][field_p], p[ours][field_o]) for p in by.values()
                 if peer in p and ours in p]
        if best and pairs:
            return round(min(x for x, _ in pairs) / min(y for _, y in pairs), 3)
        return med([x / y for x, y in pairs])

    sizes = sorted({r["bytes"] for r in records if r["section"] == "io" and r["layout"] == "large"})
    one_gib = min(sizes, key=lambda b: abs(b - (1 << 30))) if sizes else None
    fig = {"section": "figures", "state_bytes": one_gib}
    if one_gib:
        fig["save_speedup_vs_torch"] = io_ratio("torch_save", "gradsnap_embedded",
                                                "save_durable_s", "save_durable_s", one_gib)
        fig["load_speedup_vs_torch"] = io_ratio("torch_save", "gradsnap_embedded",
                                                "load_cold_s", "load_cold_s", one_gib)
        fig["load_speedup_vs_dcp"] = io_ratio("dcp_save", "gradsnap_embedded",
                                              "load_cold_s", "load_cold_s", one_gib)
        fig["save_speedup_vs_torch_best"] = io_ratio("torch_save", "gradsnap_embedded",
                                                     "save_durable_s", "save_durable_s", one_gib,
                                                     best=True)
        fig["load_speedup_vs_torch_best"] = io_ratio("torch_save", "gradsnap_embedded",
                                                     "load_cold_s", "load_cold_s", one_gib,
                                                     best=True)
        fig["load_speedup_vs_dcp_best"] = io_ratio("dcp_save", "gradsnap_embedded",
                                                   "load_cold_s", "load_cold_s", one_gib,
                                                   best=True)
        fig["save_speedup_vs_torch_server"] = io_ratio("torch_save", "gradsnap_server",
                                                       "save_durable_s", "save_durable_s", one_gib)
        fig["load_speedup_vs_torch_server"] = io_ratio("torch_save", "gradsnap_server",
                                                       "load_cold_s", "load_cold_s", one_gib)
    tr = [r for r in records if r["section"] == "train" and r["model"] == a.model]
    # The stall during training, and with each side's end-of-job wait (a record's with_end is
    # at least its stall, so a DCP median above 0 stays above 0 there).
    for suffix in ("", "_with_end"):
        ours = [r["stall_ms_per_ckpt" + suffix] for r in tr if r["mode"] == "gockpt+gradlog"]
        dcpa = [r["stall_ms_per_ckpt" + suffix] for r in tr if r["mode"] == "dcp_async_save"]
        if ours and dcpa:
            fig["stall_ms_gockpt_gradlog" + suffix] = med(ours)
            fig["stall_ms_dcp_async_save" + suffix] = med(dcpa)
            fig["stall_ratio_vs_dcp_async" + suffix] = round(
                statistics.median(ours) / statistics.median(dcpa), 4)
    for t in a.speed_threads:
        rs = [r["ratio"] for r in records if r["section"] == "speed" and r["threads"] == t]
        if rs:
            fig[f"trainer_speed_vs_torch_t{t}"] = med(rs)
    fig["targets"] = {k: v for k, v in TARGETS.items() if k in fig}
    fig["met"] = {k: (fig[k] >= float(v.split()[1]) if v.startswith(">=")
                      else fig[k] <= float(v.split()[1]))
                  for k, v in fig["targets"].items() if fig[k] is not None}
    return fig


def main():
    global OUT
    if len(sys.argv) > 1 and sys.argv[1] == "--train-worker":
        m, model, steps, every, threads, batch, seq, where = sys.argv[2:10]
        return train_worker(m, model, int(steps), int(every), int(threads), int(batch),
                            int(seq), where)
    if len(sys.argv) > 1 and sys.argv[1] == "--ws2-worker":
        kind, where, total, count, addr = sys.argv[2:7]
        return ws2_worker(kind, where, int(total), int(count), addr)
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="CI size: an 8M state, 500 small tensors, 1 pass, the tiny model, 6 steps, "
                    "3 checkpointers, 1 thread")
    ap.add_argument("--sizes", default="256M,1G",
                    help="large-tensor state sizes (K/M/G). Default: 256M,1G")
    ap.add_argument("--small-count", type=int, default=20000,
                    help="tensors of the many-small-tensors state; 0: no such state. Default: 20000")
    ap.add_argument("--small-bytes", default="256M",
                    help="bytes of the many-small-tensors state. Default: 256M")
    ap.add_argument("--reps", type=int, default=3, help="passes / rounds (1..20). Default: 3")
    ap.add_argument("--sections", default="io,ws2,flip,train,speed",
                    help="which to run. Default: io,ws2,flip,train,speed")
    for flag, typ, default, what in (
            ("--model", str, "small", "GPT shape (tiny, small)"),
            ("--steps", int, 30, "training steps per run"),
            ("--every", int, 10, "checkpoint interval"),
            ("--train-models", str, "", "GPT shapes of the train section, comma-separated "
             "(empty: tiny and --model)"),
            ("--train-trainers", str, "pytorch,gradsnap-train", "trainers of the train section"),
            ("--train-reps", int, 1, "rounds of the train section"),
            ("--train-threads", int, 2, "threads of both trainers in the train section"),
            ("--speed-threads", str, "1,2", "thread counts of the speed section"),
            ("--speed-steps", int, 10, "steps per run of the speed section"),
            ("--batch", int, 8, "batch"),
            ("--seq", int, 128, "sequence length")):
        ap.add_argument(flag, type=typ, default=default, help=f"{what}. Default: {default!r}")
    ap.add_argument("--dir", default="/var/tmp", help="scratch directory on the disk under "
                    "test. Default: /var/tmp")
    ap.add_argument("--build", default=os.path.join(ROOT, "build"),
                    help="the build directory. Default: build")
    ap.add_argument("--out", default="", help="also write the JSON lines here. Default: none")
    ap.add_argument("--figures-from", default="",
                    help="FILE,...: run nothing; print the figures line of these JSON-lines "
                    "files (runs of the sections apart) as one run. Default: none")
    a = ap.parse_args()
    if a.figures_from:
        a.speed_threads = [int(t) for t in a.speed_threads.split(",")]
        for i, path in enumerate(a.figures_from.split(",")):
            with open(path) as f:
                RECORDS.extend(dict(json.loads(x), run=i) for x in f if x.strip())
        recs = [r for r in RECORDS if r["section"] not in ("figures", "machine")]
        RECORDS.clear()
        emit(figures(recs, a))
        return None
    if a.quick:
        a.sizes, a.small_count, a.small_bytes, a.reps = "8M", 500, "2M", 1
        a.model, a.steps, a.every, a.speed_steps, a.speed_threads = "tiny", 6, 3, 4, "1"
    try:
        a.sizes = [parse_bytes(s) for s in a.sizes.split(",")]
        a.small_bytes = parse_bytes(a.small_bytes)
        a.speed_threads = [int(t) for t in a.speed_threads.split(",")]
    except ValueError as e:
        ap.error(f"bad size or thread list: {e}")
    a.sections = a.sections.split(",")
    bad = set(a.sections) - {"io", "ws2", "flip", "train", "speed"}
    if bad:
        ap.error(f"--sections: unknown {','.join(sorted(bad))}")
    if (not 1 <= a.reps <= 20 or a.small_count < 0 or min(a.sizes) < 64 or a.steps < 1
            or not 1 <= a.every <= a.steps or a.model not in ("tiny", "small")
            or min(a.speed_threads) < 1 or a.train_threads < 1 or a.train_reps < 1
            or a.speed_steps < 1 or a.batch < 1 or a.seq < 1):
        ap.error("--reps 1..20; sizes >= 64 bytes; --every 1..--steps; --model tiny|small; "
                 "threads, --train-reps, --speed-steps, --batch, --seq >= 1")
    a.train_models = (a.train_models.split(",") if a.train_models
                      else [a.model] if a.model == "tiny" else ["tiny", a.model])
    a.train_trainers = a.train_trainers.split(",")
    if set(a.train_trainers) - {"pytorch", "gradsnap-train"}:
        ap.error("--train-trainers: pytorch, gradsnap-train")
    if set(a.train_models) - {"tiny", "small"}:
        ap.error("--train-models: tiny, small")
    for b in ("gradsnap-server", "gradsnap-train"):
        if not os.access(os.path.join(a.build, "bin", b), os.X_OK):
            sys.exit(f"peers: {a.build}/bin/{b} is not built (cmake --build build --target {b})")
    sys.path.insert(0, os.path.join(a.build, "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(a.build, "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p])
    warnings.filterwarnings("ignore")
    import torch
    import gradsnap
    if a.out:
        OUT = open(a.out, "w")
    global TORCH_MODES
    try:
        import torchsnapshot  # noqa: F401
        have_ts = True
    except ImportError as e:
        have_ts = False
        emit({"section": "skip", "system": "torchsnapshot", "reason": f"not importable: {e}"})
        TORCH_MODES = [m for m in TORCH_MODES if not m.startswith("torchsnapshot")]
    torch.set_num_threads(1)
    work = tempfile.mkdtemp(prefix="peers-", dir=a.dir)
    server = Server(a.build, os.path.join(work, "server-data"))
    server.start()
    cores = os.cpu_count()
    emit({"section": "machine", "cores": cores, "loadavg_start": os.getloadavg(),
          "torch": torch.__version__, "dir": a.dir, "page_cache_drop": drop_cache(),
          "uname": " ".join(os.uname()[2:5:2])})
    embedded = gradsnap.open_dir(os.path.join(work, "embedded"))
    remote = gradsnap.connect(servers=server.addr)

    def restart_server():
        """Stopped and started again (on a new port), so it reads the flipped byte from disk."""
        server.stop()
        server.start()
        systems[-1].c.close()
        systems[-1].c = gradsnap.connect(servers=server.addr)

    systems = [TorchSave(), Dcp(), DcpAsync()] + ([TorchSnapshot()] if have_ts else []) + [
        Gradsnap(embedded, "gradsnap_embedded", os.path.join(work, "embedded")),
        Gradsnap(remote, "gradsnap_server", server.data_dir, restart_server)]
    try:
        if "io" in a.sections:
            io_section(a, systems, [server.proc.pid])
        if "ws2" in a.sections:
            ws2_section(a, server)
        if "flip" in a.sections:
            flip_section(a, [s for s in systems if s.name != "dcp_async_save"], server)
        if "train" in a.sections:
            train_section(a)
        if "speed" in a.sections:
            speed_section(a)
    finally:
        embedded.close()
        systems[-1].c.close()
        server.stop()
        shutil.rmtree(work, ignore_errors=True)
    fig = figures(RECORDS, a)
    fig["loadavg_end"] = os.getloadavg()
    emit(fig)


if __name__ == "__main__":
    main()
