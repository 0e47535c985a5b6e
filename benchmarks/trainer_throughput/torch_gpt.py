#!/usr/bin/env python3
"""PyTorch's side of trainer_throughput: the GPT of gradsnap-train (docs/trainer.md, "Models")
written as a new PyTorch user would (nanoGPT style: nn.Linear, nn.LayerNorm, GELU(tanh),
scaled_dot_product_attention with is_causal, the head tied to wte, torch.optim.AdamW with the
trainer's betas, eps and weight decay, global-norm clip 1.0), trained on the CPU in fp32 with
--threads intra-op threads on random byte tokens.

    python torch_gpt.py [--model small] [--steps 10] [--batch 8] [--seq 128] [--threads 1]

Prints one line: torch_tokens_per_s=X mean_step_ms=Y threads=T, over all --steps steps (as
gradsnap-train's summary counts them).
"""
import argparse
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# name: (context, layers, heads, channels); vocabulary 256 (bytes). trainer/model_config.cc.
MODELS = {"tiny": (32, 2, 2, 64), "small": (256, 6, 6, 384), "gpt2-124m": (1024, 12, 12, 768)}


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln1 = nn.LayerNorm(c)
        self.qkv = nn.Linear(c, 3 * c)
        self.proj = nn.Linear(c, c)
        self.ln2 = nn.LayerNorm(c)
        self.fc = nn.Linear(c, 4 * c)
        self.fcproj = nn.Linear(4 * c, c)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.nh, c // self.nh).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, ctx, layers, nh, c, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, c)
        self.wpe = nn.Embedding(ctx, c)
        self.blocks = nn.ModuleList(Block(c, nh) for _ in range(layers))
        self.lnf = nn.LayerNorm(c)
        for name, p in self.named_parameters():
            if p.dim() == 2:
                std = 0.02 / math.sqrt(2 * layers) if "proj" in name else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        t = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(t))
        for blk in self.blocks:
            x = blk(x)
        logits = self.lnf(x) @ self.wte.weight.t()
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def setup(model_name, threads, steps, batch, seq):
    """The model, its AdamW and `steps` batches of random byte tokens, seeded."""
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    ctx, layers, nh, c = MODELS[model_name]
    model = GPT(ctx, layers, nh, c)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1)
    return model, opt, torch.randint(0, 256, (steps, batch, seq + 1))


def train_step(model, opt, batch):
    """One step on `batch` (B x T+1 tokens): forward, backward, clip 1.0, AdamW."""
    loss = model(batch[:, :-1], batch[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="small")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    model, opt, data = setup(a.model, a.threads, a.steps, a.batch, a.seq)
    total = 0.0
    for s in range(a.steps):
        t0 = time.perf_counter()
        train_step(model, opt, data[s])
        total += time.perf_counter() - t0
    tokens = a.steps * a.batch * a.seq
    print(f"torch_tokens_per_s={tokens / total:.1f} mean_step_ms={1000 * total / a.steps:.1f} "
          f"threads={a.threads}", flush=True)


if __name__ == "__main__":
    main()
