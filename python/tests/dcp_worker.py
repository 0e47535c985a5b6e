"""One rank of a torch.distributed.checkpoint save or load through gradsnap, for
test_torch.py. Environment: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (Gloo back end, CPU).

    dcp_worker.py SERVER OP [+ OP ...]   (one process start, several saves and loads)
    SERVER: HOST:PORT of a gradsnap-server, or etcd=ENDPOINTS (cluster mode, replicas=2)
    OP: save JOB STEP [--async] [--pause-in-finish] [--seed N]
        load JOB STEP|latest EXPECT_STEP [--stream-fraction F]

The state is a real torch.nn model trained two steps with AdamW (its optimizer state included),
tensors sharded across the ranks (DTensors, Shard(0) and Shard(1)), a replicated one and a
BytesIO item,
all made from a seed (the step, or --seed), so every world size builds the same values. `load` fills a
fresh state from the checkpoint and compares every tensor (the sharded one whole) with the
state of EXPECT_STEP; prints "exact" and exits 0, else names the first difference, exit 1;
--stream-fraction: the Reader's stream_fraction (default: its own).
--pause-in-finish: the coordinator prints "finishing" and sleeps once every rank's shard is
durable, before the checkpoint's metadata is saved (the test kills it there)."""
import io
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

import gradsnap
import gradsnap.torch as gt


def make_state(seed, mesh):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        model(torch.randn(16, 32)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    full = torch.randn(64, 48, dtype=torch.bfloat16)
    sharded = distribute_tensor(full, mesh, [Shard(0)])
    # Split by columns: another world size reads strided pieces of the stored tensor.
    cols = distribute_tensor(torch.randn(10, 6), mesh, [Shard(1)])
    return {"model": model.state_dict(), "optim": opt.state_dict(),
            "sharded": sharded, "cols": cols,
            "ids": torch.arange(seed, seed + 100, dtype=torch.int64),
            "extra": {"step": seed, "note": io.BytesIO(f"seed {seed}".encode())}}


def blank_like(state, mesh):
    """A state of the same structure, every tensor zero (filled by dcp.load)."""
    def zero(v):
        if isinstance(v, dict):
            return {k: zero(x) for k, x in v.items()}
        if isinstance(v, torch.distributed.tensor.DTensor):
            return distribute_tensor(torch.zeros(v.shape, dtype=v.dtype), mesh, v.placements)
        if isinstance(v, torch.Tensor):
            return torch.zeros_like(v)
        if isinstance(v, io.BytesIO):
            return io.BytesIO()
        return v if not isinstance(v, (int, float)) else type(v)(0)
    return zero(state)


def compare(got, want, path=""):
    if isinstance(want, dict):
        if set(got) != set(want):
            return f"{path}: keys {sorted(got)} != {sorted(want)}"
        for k in want:
            d = compare(got[k], want[k], f"{path}/{k}")
            if d:
                return d
        return None
    if isinstance(want, torch.distributed.tensor.DTensor):
        got, want = got.full_tensor(), want.full_tensor()
    if isinstance(want, torch.Tensor):
        ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
        return None if ok else f"{path}: tensors differ"
    if isinstance(want, io.BytesIO):
        got.seek(0)
        return None if got.read() == want.getvalue() else f"{path}: bytes differ"
    return None if got == want else f"{path}: {got!r} != {want!r}"


class PausingWriter(gt.Writer):
    def finish(self, metadata, results):
        print("finishing", flush=True)
        time.sleep(600)
        super().finish(metadata, results)


def run(client, mesh, op):
    mode, job, step = op[:3]
    if mode == "save":
        seed = int(op[op.index("--seed") + 1]) if "--seed" in op else int(step)
        state = make_state(seed, mesh)
        cls = PausingWriter if "--pause-in-finish" in op else gt.Writer
        writer = cls(client, job, int(step))
        if "--async" in op:
            dcp.async_save(state, storage_writer=writer).result()
        else:
            dcp.save(state, storage_writer=writer)
        print("saved", flush=True)
    else:
        want = make_state(int(op[3]), mesh)
        got = blank_like(want, mesh)
        kw = ({"stream_fraction": float(op[op.index("--stream-fraction") + 1])}
              if "--stream-fraction" in op else {})
        dcp.load(got, storage_reader=gt.Reader(client, job,
                                               step if step == "latest" else int(step), **kw))
        diff = compare(got, want)
        print(f"{' '.join(op)}: {diff or 'exact'}", flush=True)
        if diff:
            sys.exit(1)


def main():
    server, ops = sys.argv[1], [[]]
    for arg in sys.argv[2:]:
        if arg == "+":
            ops.append([])
        else:
            ops[-1].append(arg)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    client = (gradsnap.connect(etcd=server[len("etcd="):], replicas=2)
              if server.startswith("etcd=") else gradsnap.connect(servers=server))
    for op in ops:
        run(client, mesh, op)
    client.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
