# PyTorch's side of scripts/gpu-check.sh: trains a Hugging Face Llama folder the way its users
# do, on the same data, sequence length and micro-batch as strata, and prints tokens/s.
#   --mode plain          transformers' LlamaForCausalLM (sdpa attention) on the GPU, fp32
#                         weights, bf16 autocast, fused AdamW on the GPU, clip 1.0
#   --mode fsdp2_offload  FSDP2: fully_shard per decoder layer and at the root, CPUOffloadPolicy
#                         (parameters, gradients and AdamW state in pinned host memory, the
#                         optimizer on the CPU), bf16 MixedPrecisionPolicy with fp32 reduction
# Both use AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, weight decay 0.1), strata's shipped
# configs' values. The loss is next-token cross-entropy in fp32 over seq_len targets per
# sequence, as strata's. Timing: wall clock around each step with the GPU synchronized, the
# median of the steps after the first two.
#   python3 gpu_torch_train.py --model DIR --data DIR_OR_FILE --seq-len 1024 --micro-batch 8 \
#     --steps 6 --mode plain --json out.json
import argparse
import json
import os
import pathlib
import statistics
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def token_stream(model_dir, data, need):
    tokenizer = Tokenizer.from_file(str(pathlib.Path(model_dir) / "tokenizer.json"))
    paths = sorted(p for p in pathlib.Path(data).rglob("*") if p.is_file() and not p.is_symlink())
    if pathlib.Path(data).is_file():
        paths = [pathlib.Path(data)]
    ids = []
    for path in paths:
        ids.extend(tokenizer.encode(path.read_text(errors="replace")).ids)
        if len(ids) >= need:
            break
    while len(ids) < need:  # a small corpus repeats, as strata's loader cycles
        ids.extend(ids[: need - len(ids)])
    return torch.tensor(ids[:need], dtype=torch.long)


def batches(stream, seq_len, micro_batch, steps):
    per_step = micro_batch * (seq_len + 1)
    for step in range(steps):
        chunk = stream[step * per_step:(step + 1) * per_step].view(micro_batch, seq_len + 1)
        yield chunk[:, :-1].contiguous(), chunk[:, 1:].contiguous()


def loss_of(model, inputs, targets):
    logits = model(input_ids=inputs).logits
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def build_plain(args):
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="sdpa").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1, fused=True)

    def step(inputs, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_of(model, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return model, step


def build_fsdp2_offload(args):
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    torch.cuda.set_device(0)
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="sdpa")
    policy = dict(mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                 reduce_dtype=torch.float32),
                  offload_policy=CPUOffloadPolicy(pin_memory=True))
    for layer in model.model.layers:
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), eps=1e-8,
                                  weight_decay=0.1)

    def step(inputs, targets):
        loss = loss_of(model, inputs, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss
    return model, step


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True)
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--mode", choices=["plain", "fsdp2_offload"], default="plain")
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.manual_seed(0)
    started = time.perf_counter()
    model, step = (build_plain if args.mode == "plain" else build_fsdp2_offload)(args)
    params = sum(p.numel() for p in model.parameters())
    stream = token_stream(args.model, args.data, args.steps * args.micro_batch * (args.seq_len + 1))
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {args.mode}, "
          f"{params / 1e9:.3f} B parameters, set-up {time.perf_counter() - started:.1f} s")
    times, losses = [], []
    for n, (inputs, targets) in enumerate(batches(stream, args.seq_len, args.micro_batch,
                                                  args.steps), 1):
        inputs, targets = inputs.cuda(), targets.cuda()
        torch.cuda.synchronize()
        start = time.perf_counter()
        loss = step(inputs, targets)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
        tokens = args.micro_batch * args.seq_len
        print(f"step {n:4d} | loss {losses[-1]:.4f} | {tokens / times[-1]:9.0f} tok/s | "
              f"{times[-1]:.3f} s", flush=True)
    steady = times[2:] if len(times) > 2 else times
    seconds = statistics.median(steady)
    result = {"mode": args.mode, "params": params, "s_per_step": seconds,
              "tokens_per_s": args.micro_batch * args.seq_len / seconds, "losses": losses,
              "peak_gpu_bytes": torch.cuda.max_memory_allocated()}
    print(f"tokens_per_s: {result['tokens_per_s']:.1f} (median of {len(steady)} steps, "
          f"peak GPU memory {result['peak_gpu_bytes'] / 2**30:.1f} GiB)")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    if args.mode == "fsdp2_offload":
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
