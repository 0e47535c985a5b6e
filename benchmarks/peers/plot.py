#!/usr/bin/env python3
"""The plots of docs/performance.md, from the JSON lines of benchmarks/peers/peers.py.

    plot.py PEERS.jsonl [MORE.jsonl ...] OUTDIR

Several files are read as one run (e.g. the 4 GiB I/O run made separately). Writes into OUTDIR:
  step_time.png    step time over the steps, each checkpoint mode of both trainers (--model)
  io_vs_size.png   save (until durable) and cold load time against the state size, per system
  stall_vs_size.png  the training stall per checkpoint against the state size
  cpu_per_gb.png   CPU-seconds per GB of save and load, per path (the 1 GiB state and the
                   many-small-tensors state)
"""
import json
import os
import statistics
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"torch_save": "tab:blue", "dcp_save": "tab:orange", "dcp_async_save": "tab:red",
         "torchsnapshot": "tab:purple", "torchsnapshot_async": "tab:pink",
         "gradsnap_embedded": "tab:green", "gradsnap_server": "tab:olive",
         "gradsnap_py": "tab:gray", "none": "black", "sync": "tab:brown", "async": "tab:cyan",
         "gockpt": "tab:olive", "gockpt+gradlog": "tab:green"}


def load(paths):
    recs = []
    for p in paths:
        with open(p) as f:
            recs += [json.loads(x) for x in f if x.strip()]
    return recs


def medians(rows, x, y):
    """Sorted xs (x(row)) and the median of y(row) over the rows of each."""
    pts = {}
    for r in rows:
        pts.setdefault(x(r), []).append(y(r))
    xs = sorted(pts)
    return xs, [statistics.median(pts[v]) for v in xs]


def axis(ax, xlabel, ylabel, title, legend_size=7, logy=True):
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    if logy:
        ax.set_yscale("log")
    ax.legend(fontsize=legend_size)


def save(fig, out, name):
    fig.tight_layout()
    fig.savefig(os.path.join(out, name), dpi=90)
    plt.close(fig)


def step_time(recs, out):
    tr = [r for r in recs if r["section"] == "train"]
    if not tr:
        return
    model = max({r["model"] for r in tr}, key=lambda m: max(x["state_bytes"] for x in tr
                                                            if x["model"] == m))
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=False)
    every = next(r["every"] for r in tr if r["model"] == model)
    for ax, trainer in zip(axes, ("pytorch", "gradsnap-train")):
        for r in tr:
            if r["model"] != model or r["trainer"] != trainer or r["rep"] != 0:
                continue
            ax.plot(range(1, len(r["step_ms"]) + 1), r["step_ms"], marker=".",
                    label=r["mode"], color=STYLE.get(r["mode"]))
        axis(ax, "step", "step time (ms)",
             f"{trainer}, {model} GPT, checkpoint every {every} steps")
    save(fig, out, "step_time.png")


def io_vs_size(recs, out):
    io = [r for r in recs if r["section"] == "io" and r["layout"] == "large"]
    if not io:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, field, title in ((axes[0], "save_durable_s", "save until durable"),
                             (axes[1], "load_cold_s", "cold load")):
        for s in sorted({r["system"] for r in io}):
            if field == "load_cold_s" and s == "dcp_async_save":
                continue  # the same reader as dcp_save
            xs, ys = medians([r for r in io if r["system"] == s], lambda r: r["bytes"],
                             lambda r: r[field])
            ax.plot([x / 2**30 for x in xs], ys, marker="o", label=s, color=STYLE.get(s))
        ax.set_xscale("log", base=2)
        axis(ax, "state (GiB, 8 fp32 tensors)", "seconds (median of passes)", title)
    save(fig, out, "io_vs_size.png")


def stall_vs_size(recs, out):
    fig, ax = plt.subplots(figsize=(8, 5))
    tr = [r for r in recs if r["section"] == "train" and r["mode"] != "none"]
    for key in sorted({(r["trainer"], r["mode"]) for r in tr}):
        xs, ys = medians([r for r in tr if (r["trainer"], r["mode"]) == key],
                         lambda r: r["state_bytes"], lambda r: max(r["stall_ms_per_ckpt"], 0.01))
        ax.plot([x / 2**20 for x in xs], ys, marker="o",
                ls="-" if key[0] == "gradsnap-train" else "--",
                label=f"{key[0]} {key[1]} (training)", color=STYLE.get(key[1]))
    io = [r for r in recs if r["section"] == "io" and r["layout"] == "large"
          and r["system"] in ("dcp_async_save", "torch_save", "gradsnap_embedded")]
    for s in sorted({r["system"] for r in io}):
        xs, ys = medians([r for r in io if r["system"] == s], lambda r: r["bytes"],
                         lambda r: 1000 * r["save_blocking_s"])
        ax.plot([x / 2**20 for x in xs], ys, marker="x",
                ls=":", label=f"{s} blocking call (no training)", color=STYLE.get(s))
    ax.set_xscale("log")
    axis(ax, "checkpointed state (MiB)", "stall per checkpoint (ms)",
         "training stall per checkpoint", legend_size=6)
    save(fig, out, "stall_vs_size.png")


def cpu_per_gb(recs, out):
    io = [r for r in recs if r["section"] == "io"]
    if not io:
        return
    large = [r for r in io if r["layout"] == "large"]
    one = min({r["bytes"] for r in large}, key=lambda b: abs(b - 2**30)) if large else None
    systems = sorted({r["system"] for r in io})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, (layout, nbytes) in zip(axes, (("large", one), ("small", None))):
        rows = [r for r in io if r["layout"] == layout and (nbytes is None or r["bytes"] == nbytes)]
        if not rows:
            continue
        saves, loadc = [], []
        for s in systems:
            rs = [r for r in rows if r["system"] == s]
            gb = rs[0]["bytes"] / 1e9 if rs else 1
            saves.append(statistics.median([r["save_cpu_s"] for r in rs]) / gb if rs else 0)
            loadc.append(statistics.median([r["load_cpu_s"] for r in rs]) / gb if rs else 0)
        x = range(len(systems))
        ax.bar([i - 0.2 for i in x], saves, 0.4, label="save")
        ax.bar([i + 0.2 for i in x], loadc, 0.4, label="cold load")
        ax.set_xticks(list(x))
        ax.set_xticklabels(systems, rotation=30, ha="right", fontsize=7)
        what = (f"{rows[0]['bytes'] / 2**30:.2g} GiB in 8 tensors" if layout == "large"
                else f"{rows[0]['tensors']} small tensors, {rows[0]['bytes'] / 2**20:.0f} MiB")
        axis(ax, "", "CPU-seconds per GB (user + system)", what, logy=False)
    save(fig, out, "cpu_per_gb.png")


def main():
    if len(sys.argv) < 3:
        sys.exit("usage: plot.py PEERS.jsonl [MORE.jsonl ...] OUTDIR")
    recs = load(sys.argv[1:-1])
    out = sys.argv[-1]
    os.makedirs(out, exist_ok=True)
    for f in (step_time, io_vs_size, stall_vs_size, cpu_per_gb):
        f(recs, out)
    print(f"plot: {out}/step_time.png io_vs_size.png stall_vs_size.png cpu_per_gb.png")


if __name__ == "__main__":
    main()
