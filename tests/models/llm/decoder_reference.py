# An independent PyTorch implementation of the four decoders (plain tensor ops in float64, written
# from transformers' modeling_llama / modeling_mistral / modeling_qwen2 / modeling_gpt2, no
# transformers import) for tests/models/llm/decoder_torch_test.cpp.
#   usage: decoder_reference.py DIR...   (one process for every case: importing torch is slow)
# Reads DIR/model.json (config, tensor names/shapes/offsets, tokens, loss weights) and
# DIR/params.bin (float32 little-endian, the tensors back to back); writes DIR/grads.bin
# (float64, same order) and DIR/loss.txt.
import json
import math
import sys

import torch

torch.set_default_dtype(torch.float64)


def load(directory):
    with open(f"{directory}/model.json") as f:
        model = json.load(f)
    with open(f"{directory}/params.bin", "rb") as f:
        flat = torch.frombuffer(bytearray(f.read()), dtype=torch.float32).to(torch.float64)
    params = {}
    for t in model["tensors"]:
        n = math.prod(t["shape"])
        params[t["name"]] = flat[t["offset"]:t["offset"] + n].reshape(t["shape"]).clone().requires_grad_()
    return model, params


def act(name, x):
    if name == "silu":
        return x * torch.sigmoid(x)
    if name == "gelu_tanh":
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))
    if name == "gelu":
        return torch.nn.functional.gelu(x)
    raise ValueError(name)


def rms_norm(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def inv_freq_of(c):
    hd = c["head_dim"]
    inv_freq = 1.0 / (c["rope_theta"] ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    s = c.get("rope_scaling")
    if s is None:
        return inv_freq
    # transformers' _compute_llama3_parameters
    factor, low, high, old = s["factor"], s["low_freq_factor"], s["high_freq_factor"], s["original_max_position_embeddings"]
    low_wavelen = old / low
    high_wavelen = old / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def attention(q, k, v, window):
    # q [B, H, T, hd], k/v [B, KV, T, hd]: repeat_kv, scaled scores, causal (+ window) mask.
    B, H, T, hd = q.shape
    n_rep = H // k.shape[1]
    k = k.repeat_interleave(n_rep, dim=1)
    v = v.repeat_interleave(n_rep, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    i = torch.arange(T).reshape(-1, 1)
    j = torch.arange(T).reshape(1, -1)
    allowed = j <= i
    if window:
        allowed = allowed & (i - j < window)
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def llama_forward(c, p, tokens):
    B, T = tokens.shape
    H, KV, hd, eps = c["heads"], c["kv_heads"], c["head_dim"], c["eps"]
    x = p["model.embed_tokens.weight"][tokens]
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq_of(c))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    for layer in range(c["layers"]):
        pre = f"model.layers.{layer}."
        h = rms_norm(x, p[pre + "input_layernorm.weight"], eps)

        def proj(name, heads):
            y = h @ p[pre + f"self_attn.{name}.weight"].T
            if c["qkv_bias"]:
                y = y + p[pre + f"self_attn.{name}.bias"]
            return y.reshape(B, T, heads, hd).transpose(1, 2)

        q, k, v = proj("q_proj", H), proj("k_proj", KV), proj("v_proj", KV)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        o = attention(q, k, v, c["window"]).transpose(1, 2).reshape(B, T, H * hd)
        x = x + o @ p[pre + "self_attn.o_proj.weight"].T
        h = rms_norm(x, p[pre + "post_attention_layernorm.weight"], eps)
        gate = h @ p[pre + "mlp.gate_proj.weight"].T
        up = h @ p[pre + "mlp.up_proj.weight"].T
        x = x + (act(c["activation"], gate) * up) @ p[pre + "mlp.down_proj.weight"].T
    x = rms_norm(x, p["model.norm.weight"], eps)
    head = p["model.embed_tokens.weight"] if c["tied"] else p["lm_head.weight"]
    return x @ head.T


def gpt2_forward(c, p, tokens):
    B, T = tokens.shape
    H, hd, eps, d = c["heads"], c["head_dim"], c["eps"], c["hidden"]
    ln = torch.nn.functional.layer_norm
    x = p["transformer.wte.weight"][tokens] + p["transformer.wpe.weight"][:T]
    for layer in range(c["layers"]):
        pre = f"transformer.h.{layer}."
        h = ln(x, (d,), p[pre + "ln_1.weight"], p[pre + "ln_1.bias"], eps)
        qkv = h @ p[pre + "attn.c_attn.weight"] + p[pre + "attn.c_attn.bias"]  # Conv1D [in, out]
        q, k, v = (t.reshape(B, T, H, hd).transpose(1, 2) for t in qkv.split(d, dim=-1))
        o = attention(q, k, v, 0).transpose(1, 2).reshape(B, T, d)
        x = x + o @ p[pre + "attn.c_proj.weight"] + p[pre + "attn.c_proj.bias"]
        h = ln(x, (d,), p[pre + "ln_2.weight"], p[pre + "ln_2.bias"], eps)
        h = act(c["activation"], h @ p[pre + "mlp.c_fc.weight"] + p[pre + "mlp.c_fc.bias"])
        x = x + h @ p[pre + "mlp.c_proj.weight"] + p[pre + "mlp.c_proj.bias"]
    x = ln(x, (d,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], eps)
    return x @ p["transformer.wte.weight"].T


def run(directory):
    model, params = load(directory)
    c = model["config"]
    sequence_tokens = c["sequence_tokens"]
    tokens = torch.tensor(model["tokens"], dtype=torch.int64).reshape(-1, sequence_tokens)
    weights = torch.tensor(model["weights"], dtype=torch.float64)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]
    forward = gpt2_forward if c["family"] == "gpt2" else llama_forward
    logits = forward(c, params, inputs)
    per_token = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    loss = (per_token * weights).sum() / weights.sum()
    loss.backward()
    grads = [params[t["name"]].grad.reshape(-1) for t in model["tensors"]]
    with open(f"{directory}/grads.bin", "wb") as f:
        f.write(torch.cat(grads).numpy().astype("<f8").tobytes())
    with open(f"{directory}/loss.txt", "w") as f:
        f.write(repr(loss.item()))


def main():
    for directory in sys.argv[1:]:
        run(directory)


if __name__ == "__main__":
    main()
