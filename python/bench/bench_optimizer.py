"""Optimizer steps/s on one model, one run: strata's OffloadOptimizer (state on the host, and on
NVMe when --nvme names a directory) against torch.optim.AdamW with its state beside the model, and
against torch's AdamW run on fp32 CPU copies of the parameters (torch's own way to move optimizer
state off the model's device: gradients copied to the copies, the step on the CPU, the weights
copied back). Every optimizer sees the same gradients; the model is the tests' Llama-style
decoder (tests/python/tiny_llama.py), enlarged.

  PYTHONPATH=build/release/python /usr/bin/python3 python/bench/bench_optimizer.py [--nvme DIR]

(It lives in its own folder: run from python/, the source package would shadow the built one.)

Prints, per optimizer, the time of optimizer.step() alone, for strata what it is made of (handing
the gradients over, the Engine's step, writing the weights back: last_step's hand_over_s, step_s
and write_back_s), and steps/s of the whole training step (forward, backward, step) on the same
batch; then each strata step() against the faster torch one. The optimizers take their steps in
turn, one model each, so load from elsewhere on the machine falls on all of them alike.
"""

import argparse
import os
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests",
                                "python"))
from tiny_llama import TinyLlama, loss_of  # noqa: E402

from strata.torch import OffloadOptimizer  # noqa: E402

LR, BETAS, EPS, WEIGHT_DECAY = 1e-4, (0.9, 0.95), 1e-8, 0.1


class CpuStateAdamW:
    """torch.optim.AdamW over fp32 CPU copies of the parameters: state off the model's device."""

    def __init__(self, params):
        self.params = list(params)
        self.copies = [p.detach().to("cpu", torch.float32).clone().requires_grad_()
                       for p in self.params]
        self.inner = torch.optim.AdamW(self.copies, lr=LR, betas=BETAS, eps=EPS,
                                       weight_decay=WEIGHT_DECAY)

    @torch.no_grad()
    def step(self):
        for param, copy in zip(self.params, self.copies):
            copy.grad = param.grad.to("cpu", torch.float32)
        self.inner.step()
        for param, copy in zip(self.params, self.copies):
            param.copy_(copy)

    def zero_grad(self):
        for param in self.params:
            param.grad = None


def strata_config(placement, nvme_dir, threads):
    tiers = {"device": {"kind": "host", "budget": "8GiB"}, "host": {"budget": "8GiB"}}
    zero = {"params": "device", "grads": "host", "optimizer": placement}
    if placement == "nvme":
        tiers["nvme"] = {"paths": [nvme_dir]}
    return {"tiers": tiers, "zero": zero, "precision": {"params": "fp32", "grads": "fp32"},
            "optimizer": {"grad_clip": 0.0, "threads": threads}}


def train_step(model, optimizer, tokens, targets):
    """(seconds of the whole step, seconds of optimizer.step())."""
    start = time.perf_counter()
    optimizer.zero_grad()
    loss_of(model, tokens, targets).backward()
    before = time.perf_counter()
    optimizer.step()
    end = time.perf_counter()
    return end - start, end - before


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--threads", type=int, default=os.cpu_count(),
                        help="torch threads and strata's optimizer threads")
    parser.add_argument("--nvme", help="also run strata with the optimizer state on NVMe here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    def fresh_model():
        return TinyLlama(vocab=args.vocab, dim=args.dim, heads=8, hidden=args.dim * 8 // 3,
                         layers=args.layers, max_length=args.length)

    generator = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (args.batch, args.length), generator=generator)
    targets = torch.randint(0, args.vocab, (args.batch, args.length), generator=generator)
    count = sum(p.numel() for p in fresh_model().parameters())
    print(f"model: {count / 1e6:.1f} M parameters ({args.layers} layers, d={args.dim}, "
          f"vocab {args.vocab}), batch {args.batch}x{args.length}, {args.threads} threads, "
          f"{args.steps} timed steps after {args.warmup}")

    runs = [
        ("torch.optim.AdamW (state beside the model)",
         lambda m: torch.optim.AdamW(m.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                     weight_decay=WEIGHT_DECAY)),
        ("torch AdamW on fp32 CPU copies", lambda m: CpuStateAdamW(m.parameters())),
        ("strata OffloadOptimizer, state on host",
         lambda m: OffloadOptimizer(m.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                    weight_decay=WEIGHT_DECAY,
                                    config=strata_config("host", None, args.threads))),
    ]
    if args.nvme:
        nvme_dir = tempfile.mkdtemp(prefix="strata-bench-", dir=args.nvme)
        runs.append(("strata OffloadOptimizer, state on NVMe",
                     lambda m: OffloadOptimizer(m.parameters(), lr=LR, betas=BETAS, eps=EPS,
                                                weight_decay=WEIGHT_DECAY,
                                                config=strata_config("nvme", nvme_dir,
                                                                     args.threads))))
    # Round robin, one step of each optimizer in turn, so that a change in the machine's load
    # falls on all of them alike.
    trainers = [(name, *(lambda model: (model, make(model)))(fresh_model())) for name, make in runs]
    parts = ("hand_over_s", "step_s", "write_back_s")  # of strata's step()
    totals = {name: dict.fromkeys(("whole_s", "optimizer_s") + parts, 0.0) for name, _ in runs}
    for step in range(args.warmup + args.steps):
        for name, model, optimizer in trainers:
            whole_s, optimizer_s = train_step(model, optimizer, tokens, targets)
            if step >= args.warmup:
                totals[name]["whole_s"] += whole_s
                totals[name]["optimizer_s"] += optimizer_s
                for part in parts:
                    totals[name][part] += getattr(optimizer, "last_step", {}).get(part, 0.0)
    print_table(totals, args.steps)
    for _, _, optimizer in trainers:
        if hasattr(optimizer, "close"):
            optimizer.close()
    if args.nvme:
        shutil.rmtree(nvme_dir)  # the swap files of this run


def print_table(totals, steps):
    ms = lambda seconds: f"{seconds / steps * 1e3:.1f}"
    print(f"{'optimizer':46} {'step() ms':>10} {'grads in':>9} {'Engine':>9} {'weights out':>12}"
          f" {'train steps/s':>14}")
    for name, t in totals.items():
        strata = name.startswith("strata")
        parts = [ms(t[part]) if strata else "-"
                 for part in ("hand_over_s", "step_s", "write_back_s")]
        print(f"{name:46} {ms(t['optimizer_s']):>10} {parts[0]:>9} {parts[1]:>9} {parts[2]:>12}"
              f" {steps / t['whole_s']:14.2f}")
    torch_name = min((name for name in totals if not name.startswith("strata")),
                     key=lambda name: totals[name]["optimizer_s"])
    for name, t in totals.items():
        if name.startswith("strata"):
            change = t["optimizer_s"] / totals[torch_name]["optimizer_s"] - 1
            print(f"{name}: step() {change:+.0%} against the faster torch one ({torch_name})")


if __name__ == "__main__":
    main()
