"""Shared by the Python tests: strata configs for each placement, batches split across ranks, a
scratch directory every rank agrees on, and the reference: the same model trained by
torch.optim.AdamW with torch's global-norm clipping."""

import atexit
import os
import shutil
import tempfile

import torch

import strata
from strata import _strata
from tiny_llama import TinyLlama, loss_of

LR, BETAS, EPS, WEIGHT_DECAY, CLIP = 1e-2, (0.9, 0.95), 1e-8, 0.1, 0.5
BATCH, LENGTH, VOCAB = 6, 16, 48  # BATCH divides by 1, 2 and 3 ranks

torch.set_num_threads(1)


_scratch_dirs = []


def scratch_dir(label):
    """A new directory under STRATA_TEST_TMPDIR, the same on every rank, removed at exit."""
    root = os.environ.get("STRATA_TEST_TMPDIR", tempfile.gettempdir())
    os.makedirs(root, exist_ok=True)
    name = tempfile.mkdtemp(prefix=f"python-{label}-", dir=root) if strata.rank() == 0 else ""
    name = _strata.broadcast_text(name)
    if not _scratch_dirs:
        atexit.register(_remove_scratch_dirs)
    _scratch_dirs.append(name)
    return name


def _remove_scratch_dirs():
    _strata.barrier()  # every rank is done with them
    if strata.rank() == 0:
        for name in _scratch_dirs:
            shutil.rmtree(name, ignore_errors=True)


def config(placement, scratch, **optimizer):
    """fp32 everywhere (the reference is fp32); `placement` "host" or "nvme" homes the optimizer
    state (and, for "nvme", parameters and gradients too) there. Tiny units are not kept
    gathered, so ZeRO-3 really releases and re-gathers them."""
    tier = {"host": {"params": "device", "grads": "host", "optimizer": "host"},
            "nvme": {"params": "nvme", "grads": "nvme", "optimizer": "nvme"}}[placement]
    return {
        "run": {"seed": 7},
        "tiers": {"device": {"kind": "host", "budget": "64MiB"}, "host": {"budget": "64MiB"},
                  "nvme": {"paths": [scratch], "fsync": False}},
        "zero": dict(tier, sub_group_size=1024, persistence_threshold=0),
        "precision": {"params": "fp32", "grads": "fp32"},
        "optimizer": dict({"type": "adamw", "lr": LR, "betas": list(BETAS), "eps": EPS,
                           "weight_decay": WEIGHT_DECAY, "grad_clip": CLIP, "threads": 1},
                          **optimizer),
    }


def batch(step):
    """The step's whole batch: arithmetic sequences mod VOCAB, so the next token is learnable."""
    generator = torch.Generator().manual_seed(1000 + step)
    starts = torch.randint(0, VOCAB, (BATCH, 1), generator=generator)
    strides = torch.randint(1, 4, (BATCH, 1), generator=generator)
    sequence = (starts + strides * torch.arange(LENGTH + 1)) % VOCAB
    return sequence[:, :-1], sequence[:, 1:]


def local_batch(step):
    """This rank's rows of the step's batch."""
    tokens, targets = batch(step)
    rows = BATCH // strata.world_size()
    begin = strata.rank() * rows
    return tokens[begin:begin + rows], targets[begin:begin + rows]


def train_reference(steps, model=None, param_groups=None, schedule=None):
    """(model, losses) after `steps` AdamW steps on the whole batch."""
    model = model or TinyLlama()
    groups = param_groups(model) if param_groups else model.parameters()
    optimizer = torch.optim.AdamW(groups, lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = schedule(optimizer) if schedule else None
    losses = []
    for step in range(steps):
        loss = loss_of(model, *batch(step))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        if scheduler:
            scheduler.step()
        losses.append(loss.item())
    return model, losses


def train_strata(model, optimizer, steps, first_step=0, schedule=None):
    """Losses (this rank's) of `steps` steps on this rank's rows."""
    losses = []
    for step in range(first_step, first_step + steps):
        loss = loss_of(model, *local_batch(step))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if schedule:
            schedule.step()
        losses.append(loss.item())
    return losses


def assert_close_params(test, expected, actual, atol=2e-5, rtol=1e-4):
    """expected, actual: {name: tensor}."""
    test.assertEqual(sorted(expected), sorted(actual))
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value.detach(), atol=atol, rtol=rtol,
                                   msg=lambda m, name=name: f"{name}: {m}")
