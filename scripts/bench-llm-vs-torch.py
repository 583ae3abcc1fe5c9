# The PyTorch side of scripts/bench-llm-vs-torch.sh: the same Llama-architecture decoder as
# strata's (RMSNorm, rotate-half RoPE, GQA, SwiGLU, untied head), fp32 on the CPU, plain tensor
# ops (torch 1.13 has no scaled_dot_product_attention), timed forward + backward.
#   bench-llm-vs-torch.py CONFIG_JSON THREADS BATCH SEQ_LEN STEPS
import json
import math
import sys
import time

import torch

config_path, threads, batch, seq, steps = sys.argv[1], *map(int, sys.argv[2:6])
torch.set_num_threads(threads)
torch.manual_seed(0)
c = json.load(open(config_path))
# Equal work or no figure: refuse what this model leaves out but strata-llm-bench would run.
for key, plain in (("architectures", ["LlamaForCausalLM"]), ("tie_word_embeddings", False),
                   ("rope_scaling", None), ("hidden_act", "silu")):
    if c.get(key, plain) != plain:
        sys.exit(f"{config_path}: key {key!r} = {c[key]!r} is not modelled here (only {plain!r})")
d, inner, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
H, vocab, eps = c["num_attention_heads"], c["vocab_size"], c["rms_norm_eps"]
KV, hd = c.get("num_key_value_heads", H), c.get("head_dim", d // H)


def param(*shape, ones=False):
    t = torch.ones(*shape) if ones else torch.randn(*shape) * 0.02
    return t.requires_grad_()


embed, lm_head, final_norm = param(vocab, d), param(vocab, d), param(d, ones=True)
blocks = [dict(n1=param(d, ones=True), q=param(H * hd, d), k=param(KV * hd, d), v=param(KV * hd, d),
               o=param(d, H * hd), n2=param(d, ones=True), gate=param(inner, d), up=param(inner, d),
               down=param(d, inner)) for _ in range(layers)]
inv_freq = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, hd, 2).float() / hd))
freqs = torch.outer(torch.arange(seq).float(), inv_freq)
cos, sin = torch.cat((freqs, freqs), -1).cos(), torch.cat((freqs, freqs), -1).sin()
mask = torch.full((seq, seq), float("-inf")).triu(1)


def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin


def forward(tokens):
    x = embed[tokens[:, :-1]]
    for b in blocks:
        h = rms(x, b["n1"])
        q = rope((h @ b["q"].T).view(batch, seq, H, hd).transpose(1, 2))
        k = rope((h @ b["k"].T).view(batch, seq, KV, hd).transpose(1, 2))
        v = (h @ b["v"].T).view(batch, seq, KV, hd).transpose(1, 2)
        k, v = k.repeat_interleave(H // KV, 1), v.repeat_interleave(H // KV, 1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, -1) @ v
        x = x + att.transpose(1, 2).reshape(batch, seq, H * hd) @ b["o"].T
        h = rms(x, b["n2"])
        x = x + (torch.nn.functional.silu(h @ b["gate"].T) * (h @ b["up"].T)) @ b["down"].T
    logits = rms(x, final_norm) @ lm_head.T
    return torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))


tokens = torch.randint(0, vocab, (batch, seq + 1))
params = [embed, lm_head, final_norm] + [p for b in blocks for p in b.values()]
print(f"parameters: {sum(p.numel() for p in params) / 1e6:.1f} M, torch {torch.__version__}, "
      f"{torch.get_num_threads()} threads")


def step():
    for p in params:
        p.grad = None
    loss = forward(tokens)
    loss.backward()
    return loss.item()


print(f"loss at init: {step():.4f}")  # warm-up
best = math.inf
for _ in range(steps):
    start = time.perf_counter()
    step()
    best = min(best, time.perf_counter() - start)
print(f"forward + backward: {best * 1e3:.1f} ms best over {steps} steps")
print(f"tokens_per_s: {batch * seq / best:.1f}")
