"""A PyTorch training loop that checkpoints through a gradsnap-server every N steps with
torch.distributed.checkpoint.async_save and resumes from the newest committed checkpoint when
restarted (docs/python.md). One process, or several under torchrun (Gloo).

    python examples/torch_train.py --server 127.0.0.1:7070 [--job demo] [--steps 200]
        [--every 20] [--token-file F]
"""
import argparse
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

import gradsnap
import gradsnap.torch


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", required=True, help="gradsnap-server HOST:PORT")
    ap.add_argument("--job", default="demo", help="checkpoint job name. Default: demo")
    ap.add_argument("--steps", type=int, default=200, help="train to this step. Default: 200")
    ap.add_argument("--every", type=int, default=20, help="checkpoint every N steps. Default: 20")
    ap.add_argument("--token-file", help="the job's token (gradsnap token). Default: none")
    a = ap.parse_args()

    if "WORLD_SIZE" in os.environ:  # torchrun
        dist.init_process_group("gloo")
    token = open(a.token_file).read().strip() if a.token_file else None
    client = gradsnap.connect(servers=a.server, token=token)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 64))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": 0}

    # Resume: the newest checkpoint every rank finished (a killed save is never listed).
    if client.list(a.job):
        dcp.load(state, storage_reader=gradsnap.torch.Reader(client, a.job, "latest"))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        print(f"resumed from step {state['step']}", flush=True)
    start = state["step"]

    pending = None  # the async save in flight
    for step in range(start + 1, a.steps + 1):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(32, 64, generator=g)
        loss = (model(x) - x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % a.every == 0:
            if pending is not None:
                pending.result()  # one save in flight at a time
            state = {"model": model.state_dict(), "optim": opt.state_dict(), "step": step}
            pending = dcp.async_save(
                state, storage_writer=gradsnap.torch.Writer(client, a.job, step))
            print(f"step {step} loss {loss.item():.4f}: checkpoint started", flush=True)
    if pending is not None:
        pending.result()
    print(f"done at step {max(start, a.steps)}", flush=True)
    client.close()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
