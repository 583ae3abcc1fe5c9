# An independent reader of a Hugging Face model folder (what strata-finetune --export writes),
# written from the safetensors format specification and transformers' loading rules, not from
# strata's code; neither transformers nor the safetensors package is imported (Debian has neither).
# It reads the folder as `AutoModelForCausalLM.from_pretrained` would and refuses what that would
# refuse or silently get wrong, then computes the model's loss on given tokens with the float64
# forward of decoder_reference.py (imported, fed the HF-named tensors).
#
#   hf_folder_reader.py FOLDER [--tokens 1,2,3/4,5,6] [--dtype bf16|f16|f32] [--max-shard-bytes N]
#   hf_folder_reader.py --cases CASES.json      (many folders, one process: importing torch is slow)
#
# CASES.json is a list of {"folder", "tokens": [[...], ...], "dtype", "max_shard_bytes",
# "rounding_of": an fp32 folder whose torch bf16 rounding this folder must hold bitwise}; every
# key but "folder" is optional. Prints one JSON object per folder, one per line:
#   {"folder", "ok", "error" (what was refused and where), "loss" (mean next-token cross-entropy
#    in nats, or null without tokens), "tensors", "files", "dtype"}.
#
# Checked (each refusal names the file and the tensor or key):
#   config.json: architectures is one of LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM /
#     GPT2LMHeadModel and model_type matches it (AutoConfig needs model_type); torch_dtype (or
#     transformers 5's dtype) names the dtype the tensors are stored in.
#   Which weights: model.safetensors, else model.safetensors.index.json and its shards (both
#     present is ambiguous: transformers would take the single file and ignore the index); shard
#     names model-0000i-of-0000N.safetensors; no stray shard outside the index.
#   Each safetensors file, per the format: 8-byte little-endian header length N (at most 100 MB,
#     a multiple of 8 so the data is 8-byte aligned, as safetensors' writer pads it), a JSON object
#     (starting with '{', no duplicate keys), "__metadata__" a str -> str map whose "format" is "pt"
#     (transformers refuses other formats), every tensor {"dtype", "shape", "data_offsets"} with
#     end - begin = numel x dtype size, offsets relative to the data after the header, the tensors
#     covering that data exactly: no overlap, no gap, nothing after the last.
#   The index: weight_map names every tensor of the shards and each in the file that holds it,
#     metadata.total_size is the sum of the tensors' bytes; a shard's tensors total at most
#     --max-shard-bytes unless it holds one tensor alone.
#   The tensors: exactly the names and shapes the architecture's modeling file creates for this
#     config (a missing, unexpected or mis-shaped tensor is refused, stricter than transformers,
#     which only warns and initialises missing ones at random), all in one floating dtype, finite.
import json
import math
import os
import re
import struct
import sys

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import decoder_reference as reference  # noqa: E402  (sets float64 as torch's default dtype)

SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
MAX_HEADER = 100_000_000  # safetensors' MAX_HEADER_SIZE
# The specification's dtypes and their sizes; only the floating ones can hold model weights.
SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2,
         "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "F64": 8, "I64": 8, "U64": 8}
TORCH = {"F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32, "F64": torch.float64}
CONFIG_DTYPES = {"float16": "F16", "bfloat16": "BF16", "float32": "F32", "float64": "F64"}
ARGUMENT_DTYPES = {"f16": "F16", "fp16": "F16", "bf16": "BF16", "f32": "F32", "fp32": "F32"}
FAMILIES = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
            "Qwen2ForCausalLM": "qwen2", "GPT2LMHeadModel": "gpt2"}
# Non-parameter buffers older checkpoints carry; transformers ignores them when loading.
IGNORED = [re.compile(p) for p in (r".*\.rotary_emb\.inv_freq$", r".*\.attn\.masked_bias$",
                                   r".*\.attn\.bias$")]


class Refused(Exception):
    pass


def no_duplicates(pairs):
    keys = [k for k, _ in pairs]
    for k in keys:
        if keys.count(k) > 1:
            raise Refused(f"duplicate key {k!r}")
    return dict(pairs)


# ---- config.json: the model transformers would build ------------------------------------------

def read_config(folder):
    path = os.path.join(folder, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError) as e:
        raise Refused(f"{path}: {e}")
    architectures = config.get("architectures")
    if not isinstance(architectures, list) or len(architectures) != 1 or \
            architectures[0] not in FAMILIES:
        raise Refused(f"{path}: architectures {architectures!r} is not one of {sorted(FAMILIES)}")
    family = FAMILIES[architectures[0]]
    if config.get("model_type") != family:
        raise Refused(f"{path}: model_type {config.get('model_type')!r} should be {family!r} for "
                      f"{architectures[0]} (AutoConfig picks the class from it)")
    return path, family, config


# The defaults are those of transformers' LlamaConfig / MistralConfig / Qwen2Config / GPT2Config.
def shapes_of(family, c):
    if family == "gpt2":
        return gpt2_shapes(c)
    defaults = {"llama": (32000, 4096, 11008, 32, 32, None),
                "mistral": (32000, 4096, 14336, 32, 32, 8),
                "qwen2": (151936, 4096, 22016, 32, 32, 32)}[family]
    vocab = c.get("vocab_size", defaults[0])
    hidden = c.get("hidden_size", defaults[1])
    inner = c.get("intermediate_size", defaults[2])
    layers = c.get("num_hidden_layers", defaults[3])
    heads = c.get("num_attention_heads", defaults[4])
    kv = c.get("num_key_value_heads", defaults[5]) or heads
    head_dim = c.get("head_dim") or hidden // heads
    qkv_bias = family == "qwen2" or c.get("attention_bias", False)
    out_bias = family == "llama" and c.get("attention_bias", False)
    mlp_bias = family == "llama" and c.get("mlp_bias", False)
    shapes = {"model.embed_tokens.weight": [vocab, hidden], "model.norm.weight": [hidden]}
    for i in range(layers):
        p = f"model.layers.{i}."
        for name, rows in (("q_proj", heads * head_dim), ("k_proj", kv * head_dim),
                           ("v_proj", kv * head_dim)):
            shapes[p + f"self_attn.{name}.weight"] = [rows, hidden]
            if qkv_bias:
                shapes[p + f"self_attn.{name}.bias"] = [rows]
        shapes[p + "self_attn.o_proj.weight"] = [hidden, heads * head_dim]
        if out_bias:
            shapes[p + "self_attn.o_proj.bias"] = [hidden]
        for name, out, inp in (("gate_proj", inner, hidden), ("up_proj", inner, hidden),
                               ("down_proj", hidden, inner)):
            shapes[p + f"mlp.{name}.weight"] = [out, inp]
            if mlp_bias:
                shapes[p + f"mlp.{name}.bias"] = [out]
        shapes[p + "input_layernorm.weight"] = [hidden]
        shapes[p + "post_attention_layernorm.weight"] = [hidden]
    tied = c.get("tie_word_embeddings", False)
    if not tied:
        shapes["lm_head.weight"] = [vocab, hidden]
    return shapes, tied


def gpt2_shapes(c):
    vocab, d = c.get("vocab_size", 50257), c.get("n_embd", 768)
    inner = c.get("n_inner") or 4 * d
    shapes = {"transformer.wte.weight": [vocab, d],
              "transformer.wpe.weight": [c.get("n_positions", 1024), d],
              "transformer.ln_f.weight": [d], "transformer.ln_f.bias": [d]}
    for i in range(c.get("n_layer", 12)):
        p = f"transformer.h.{i}."
        # Conv1D stores its weight [in, out].
        for name, shape in (("ln_1.weight", [d]), ("ln_1.bias", [d]),
                            ("attn.c_attn.weight", [d, 3 * d]), ("attn.c_attn.bias", [3 * d]),
                            ("attn.c_proj.weight", [d, d]), ("attn.c_proj.bias", [d]),
                            ("ln_2.weight", [d]), ("ln_2.bias", [d]),
                            ("mlp.c_fc.weight", [d, inner]), ("mlp.c_fc.bias", [inner]),
                            ("mlp.c_proj.weight", [inner, d]), ("mlp.c_proj.bias", [d])):
            shapes[p + name] = shape
    tied = c.get("tie_word_embeddings", True)
    if not tied:
        shapes["lm_head.weight"] = [vocab, d]
    return shapes, tied


# ---- safetensors files -------------------------------------------------------------------------

def read_safetensors(path):
    """name -> (dtype, shape, raw bytes) of every tensor, after checking the file per the spec."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Refused(f"{path}: {len(data)} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack("<Q", data[:8])
    if n > MAX_HEADER or 8 + n > len(data):
        raise Refused(f"{path}: header length {n} exceeds the file ({len(data)} bytes) or 100 MB")
    if n % 8 != 0:
        raise Refused(f"{path}: header length {n} is not a multiple of 8, so the tensor data is "
                      "not 8-byte aligned (safetensors' writer pads the header with spaces)")
    raw = data[8:8 + n]
    if raw[:1] != b"{":
        raise Refused(f"{path}: the header does not start with '{{'")
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, ValueError, Refused) as e:
        raise Refused(f"{path}: header: {e}")
    if not isinstance(header, dict):
        raise Refused(f"{path}: the header is not a JSON object")
    metadata = header.pop("__metadata__", None)
    if not isinstance(metadata, dict) or \
            not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise Refused(f"{path}: __metadata__ {metadata!r} is not a map of strings")
    if metadata.get("format") != "pt":
        raise Refused(f"{path}: __metadata__.format is {metadata.get('format')!r}, not 'pt' "
                      "(transformers refuses such an archive)")
    buffer = data[8 + n:]
    spans = []
    for name, entry in header.items():
        where = f"{path}: tensor {name}"
        if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
            raise Refused(f"{where}: expected exactly dtype, shape, data_offsets, got {entry!r}")
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if dtype not in SIZES:
            raise Refused(f"{where}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(type(x) is int and x >= 0 for x in shape):
            raise Refused(f"{where}: shape {shape!r} is not a list of non-negative integers")
        if not isinstance(offsets, list) or len(offsets) != 2 or \
                not all(type(x) is int and x >= 0 for x in offsets) or offsets[0] > offsets[1]:
            raise Refused(f"{where}: data_offsets {offsets!r} is not [begin, end]")
        if offsets[1] - offsets[0] != math.prod(shape) * SIZES[dtype]:
            raise Refused(f"{where}: data_offsets {offsets} hold {offsets[1] - offsets[0]} bytes, "
                          f"shape {shape} of {dtype} needs {math.prod(shape) * SIZES[dtype]}")
        spans.append((offsets[0], offsets[1], name))
    end = 0
    for begin, stop, name in sorted(spans):
        if begin != end:
            kind = "overlaps the previous tensor" if begin < end else f"leaves a gap at byte {end}"
            raise Refused(f"{path}: tensor {name} at data offset {begin} {kind}")
        end = stop
    if end != len(buffer):
        raise Refused(f"{path}: the tensors cover {end} bytes of data, the file holds {len(buffer)}")
    return {name: (entry["dtype"], entry["shape"], buffer[entry["data_offsets"][0]:
                                                          entry["data_offsets"][1]])
            for name, entry in header.items()}


def read_weights(folder, max_shard_bytes):
    """name -> (dtype, shape, bytes, file) from the single file or the index and its shards."""
    single, index = os.path.join(folder, SINGLE), os.path.join(folder, INDEX)
    shard_pattern = re.compile(r"model-(\d{5})-of-(\d{5})\.safetensors$")
    shards_present = sorted(f for f in os.listdir(folder) if shard_pattern.match(f))
    if os.path.exists(single):
        if os.path.exists(index) or shards_present:
            raise Refused(f"{folder}: holds {SINGLE} and also {INDEX} or shards "
                          f"{shards_present}: transformers would load {SINGLE} and ignore them")
        tensors = {k: v + (SINGLE,) for k, v in read_safetensors(single).items()}
        check_shard_size(single, tensors, max_shard_bytes)
        return tensors, [SINGLE]
    if not os.path.exists(index):
        raise Refused(f"{folder}: neither {SINGLE} nor {INDEX}")
    try:
        with open(index, encoding="utf-8") as f:
            document = json.load(f)
        weight_map = document["weight_map"]
        total_size = document["metadata"]["total_size"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"{index}: {e!r} (needs weight_map and metadata.total_size)")
    if not isinstance(weight_map, dict) or type(total_size) is not int:
        raise Refused(f"{index}: weight_map must be an object and metadata.total_size an integer")
    files = sorted(set(weight_map.values()))
    count = len(files)
    for number, name in enumerate(files, 1):
        if name != f"model-{number:05d}-of-{count:05d}.safetensors":
            raise Refused(f"{index}: shard {name!r} is not model-{number:05d}-of-{count:05d}")
    stray = sorted(set(shards_present) - set(files))
    if stray:
        raise Refused(f"{folder}: shards {stray} are not in {INDEX}")
    tensors = {}
    for name in files:
        path = os.path.join(folder, name)
        if not os.path.exists(path):
            raise Refused(f"{index}: shard {name} is missing")
        shard = read_safetensors(path)
        for tensor, value in shard.items():
            if tensor in tensors:
                raise Refused(f"{path}: tensor {tensor} is also in {tensors[tensor][3]}")
            if weight_map.get(tensor) != name:
                raise Refused(f"{index}: weight_map puts {tensor} in {weight_map.get(tensor)!r}, "
                              f"it is in {name}")
            tensors[tensor] = value + (name,)
        check_shard_size(path, shard, max_shard_bytes)
    for tensor, name in weight_map.items():
        if tensor not in tensors:
            raise Refused(f"{index}: weight_map lists {tensor} in {name}, which does not hold it")
    stored = sum(len(value[2]) for value in tensors.values())
    if total_size != stored:
        raise Refused(f"{index}: metadata.total_size {total_size} != {stored} bytes of tensors")
    return tensors, files


def check_shard_size(path, tensors, max_shard_bytes):
    size = sum(len(value[2]) for value in tensors.values())
    if max_shard_bytes is not None and size > max_shard_bytes and len(tensors) > 1:
        raise Refused(f"{path}: {size} bytes of tensors exceed the shard limit {max_shard_bytes}")


# ---- the model -----------------------------------------------------------------------------------

def decode(dtype, shape, raw):
    if math.prod(shape) == 0:
        return torch.zeros(shape, dtype=TORCH[dtype])
    return torch.frombuffer(bytearray(raw), dtype=TORCH[dtype]).reshape(shape)


def load_model(folder, want_dtype, max_shard_bytes):
    config_path, family, c = read_config(folder)
    tensors, files = read_weights(folder, max_shard_bytes)
    if family == "gpt2" and not any(k.startswith("transformer.") for k in tensors):
        # A GPT2Model checkpoint: transformers adds the base model prefix to every name.
        tensors = {"transformer." + k: v for k, v in tensors.items()}
    expected, tied = shapes_of(family, c)
    where = {k: os.path.join(folder, v[3]) for k, v in tensors.items()}
    for name in expected:
        if name not in tensors:
            raise Refused(f"{folder}: tensor {name} (shape {expected[name]}) is missing")
    head = "transformer.wte.weight" if family == "gpt2" else "model.embed_tokens.weight"
    dtypes = set()
    params = {}
    for name, (dtype, shape, raw, _) in tensors.items():
        if name not in expected:
            if any(p.match(name) for p in IGNORED):
                continue
            if tied and name == "lm_head.weight" and raw == tensors[head][2]:
                continue  # a tied head saved anyway, equal to the embedding
            raise Refused(f"{where[name]}: unexpected tensor {name} for {family}")
        if shape != expected[name]:
            raise Refused(f"{where[name]}: tensor {name} has shape {shape}, {family} with this "
                          f"config.json needs {expected[name]}")
        if dtype not in TORCH:
            raise Refused(f"{where[name]}: tensor {name} is {dtype}, not a floating dtype")
        dtypes.add(dtype)
        params[name] = decode(dtype, shape, raw)
        if not torch.isfinite(params[name]).all():
            raise Refused(f"{where[name]}: tensor {name} holds non-finite values")
    if len(dtypes) > 1:
        raise Refused(f"{folder}: tensors in several dtypes {sorted(dtypes)}")
    stored = dtypes.pop() if dtypes else None
    if want_dtype is not None and stored != want_dtype:
        raise Refused(f"{folder}: tensors are {stored}, the export asked for {want_dtype}")
    key = "torch_dtype" if "torch_dtype" in c else "dtype"
    if c.get(key) is not None and CONFIG_DTYPES.get(c[key]) != stored:
        raise Refused(f"{config_path}: {key} {c[key]!r} but the tensors are stored as {stored} "
                      "(torch_dtype='auto' would load them as the config says)")
    return family, c, params, tied, files, stored


def reference_config(family, c, tied):
    """The plain numbers decoder_reference.py's forward reads, from config.json."""
    if family == "gpt2":
        d, heads = c.get("n_embd", 768), c.get("n_head", 12)
        if not tied:
            raise Refused("GPT-2 with an untied head: decoder_reference.py ties it")
        act = c.get("activation_function", "gelu_new")
        return {"hidden": d, "heads": heads, "head_dim": d // heads, "layers": c.get("n_layer", 12),
                "eps": c.get("layer_norm_epsilon", 1e-5), "activation": activation(act)}
    heads = c.get("num_attention_heads", 32)
    hidden = c.get("hidden_size", 4096)
    default_kv = {"llama": None, "mistral": 8, "qwen2": 32}[family]
    if family == "llama" and (c.get("attention_bias") or c.get("mlp_bias")):
        raise Refused("attention_bias / mlp_bias: decoder_reference.py has no o_proj or MLP biases")
    scaling = c.get("rope_scaling")
    if scaling is not None:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind == "default":
            scaling = None
        elif kind != "llama3":
            raise Refused(f"rope_scaling type {kind!r}: the reference implements llama3 only")
    window = 0
    if family == "mistral":
        window = c.get("sliding_window", 4096) or 0
    elif family == "qwen2" and c.get("use_sliding_window", False):
        raise Refused("Qwen2 use_sliding_window: not implemented by the reference")
    return {"hidden": hidden, "heads": heads,
            "kv_heads": c.get("num_key_value_heads", default_kv) or heads,
            "head_dim": c.get("head_dim") or hidden // heads,
            "layers": c.get("num_hidden_layers", 32), "eps": c.get("rms_norm_eps", 1e-6),
            "rope_theta": c.get("rope_theta", 10000.0), "rope_scaling": scaling, "window": window,
            "activation": activation(c.get("hidden_act", "silu")), "tied": tied,
            "qkv_bias": family == "qwen2"}


def activation(name):
    names = {"silu": "silu", "swish": "silu", "gelu_new": "gelu_tanh",
             "gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu"}
    if name not in names:
        raise Refused(f"activation {name!r} is not implemented by the reference")
    return names[name]


def loss_of(family, c, params, tied, tokens):
    rc = reference_config(family, c, tied)
    params = {k: v.to(torch.float64) for k, v in params.items()}
    tokens = torch.tensor(tokens, dtype=torch.int64)
    if tokens.ndim != 2 or tokens.shape[1] < 2:
        raise Refused(f"tokens: expected sequences of at least 2 tokens, got {list(tokens.shape)}")
    forward = reference.gpt2_forward if family == "gpt2" else reference.llama_forward
    with torch.no_grad():
        logits = forward(rc, params, tokens[:, :-1])
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1)).item()


def check_rounding(params, fp32_folder):
    """Each tensor equals torch's round-to-nearest-even bf16 of the fp32 folder's tensor."""
    _, _, source, _, _, stored = load_model(fp32_folder, "F32", None)
    for name, value in params.items():
        rounded = source[name].to(torch.bfloat16)
        differ = (value.view(torch.int16) != rounded.view(torch.int16)).sum().item()
        if differ:
            raise Refused(f"tensor {name}: {differ} of {value.numel()} values differ from torch's "
                          f"bf16 rounding of {fp32_folder}'s")


def read_case(case):
    folder = case["folder"]
    result = {"folder": folder, "ok": False, "error": None, "loss": None}
    try:
        want = case.get("dtype")
        want = ARGUMENT_DTYPES.get(want.lower(), want) if want else None
        family, c, params, tied, files, stored = load_model(
            folder, want, case.get("max_shard_bytes"))
        if case.get("rounding_of"):
            check_rounding(params, case["rounding_of"])
        if case.get("tokens"):
            result["loss"] = loss_of(family, c, params, tied, case["tokens"])
        result.update(ok=True, tensors=len(params), files=files, dtype=stored)
    except (Refused, OSError) as e:
        result["error"] = str(e)
    return result


def main(argv):
    if len(argv) == 2 and argv[0] == "--cases":
        with open(argv[1], encoding="utf-8") as f:
            cases = json.load(f)
    else:
        case = {"folder": argv[0]} if argv else None
        for flag, value in zip(argv[1::2], argv[2::2]):
            if flag == "--tokens":
                case["tokens"] = [[int(t) for t in s.split(",")] for s in value.split("/")]
            elif flag == "--dtype":
                case["dtype"] = value
            elif flag == "--max-shard-bytes":
                case["max_shard_bytes"] = int(value)
            else:
                case = None
                break
        if case is None or len(argv) % 2 == 0:
            sys.exit("usage: hf_folder_reader.py FOLDER [--tokens 1,2,3/4,5,6] [--dtype bf16|f16|f32]"
                     " [--max-shard-bytes N]\n       hf_folder_reader.py --cases CASES.json")
        cases = [case]
    results = [read_case(case) for case in cases]
    for result in results:
        print(json.dumps(result))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
