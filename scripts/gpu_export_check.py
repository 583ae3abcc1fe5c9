# Checks a model folder strata exported (strata-finetune --model ... --export DIR) with the
# libraries its users load it with, on the GPU machine of scripts/gpu-check.sh:
#  1. the tokenizers library's ids for the text equal strata's (strata-eval --dump's
#     token_ids.json);
#  2. transformers' from_pretrained loads the folder; its fp32 logits on strata-eval's first
#     window equal strata-eval's (first_window_logits.f32) within a relative Frobenius error of
#     1e-3 (both compute in fp32 from the same bf16 weights: only summation order differs; a
#     wrong tensor name, transposition or RoPE convention is O(1));
#  3. the mean next-token NLL over that window, from transformers' logits, against strata's.
# Prints "export-check: ..." lines; exits 1 on a mismatch.
import argparse
import json
import math
import pathlib
import sys

import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--dump", required=True)
    parser.add_argument("--eval-json", required=True)
    parser.add_argument("--text", required=True)
    parser.add_argument("--seq-len", type=int, required=True)
    args = parser.parse_args()
    dump = pathlib.Path(args.dump)
    ok = True

    strata_ids = json.loads((dump / "token_ids.json").read_text())
    tokenizer = Tokenizer.from_file(str(pathlib.Path(args.model) / "tokenizer.json"))
    text = pathlib.Path(args.text).read_text()
    ids = tokenizer.encode(text).ids
    same = ids == strata_ids
    first_diff = next((i for i, (a, b) in enumerate(zip(ids, strata_ids)) if a != b),
                      min(len(ids), len(strata_ids)))
    print(f"export-check: tokenizer ids {'equal' if same else 'DIFFER'} "
          f"({len(strata_ids)} strata, {len(ids)} tokenizers"
          f"{'' if same else f', first difference at {first_diff}'})")
    ok &= same

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32,
                                                 attn_implementation="eager")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = model.to(device).eval()
    window = min(args.seq_len, len(strata_ids))
    inputs = torch.tensor(strata_ids[: window - 1], device=device).unsqueeze(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    with torch.no_grad():
        logits = model(input_ids=inputs).logits[0].double().cpu()
    vocab = logits.shape[-1]
    theirs = np.fromfile(dump / "first_window_logits.f32", dtype="<f4")
    if theirs.size != logits.numel():
        print(f"export-check: logits shape DIFFERS: strata {theirs.size} floats, "
              f"transformers {tuple(logits.shape)}")
        sys.exit(1)
    strata_logits = torch.from_numpy(theirs.astype(np.float64)).view(window - 1, vocab)
    error = (strata_logits - logits).norm() / logits.norm()
    worst = (strata_logits - logits).abs().max().item()
    print(f"export-check: logits relative error {error.item():.2e} (bound 1e-3), largest "
          f"difference {worst:.2e}, {window - 1} positions x {vocab}")
    ok &= error.item() <= 1e-3

    targets = torch.tensor(strata_ids[1:window])
    nll = F.cross_entropy(logits, targets).item()
    strata_nll = F.cross_entropy(strata_logits, targets).item()
    print(f"export-check: first-window mean NLL transformers {nll:.6f}, strata {strata_nll:.6f} "
          f"(strata-eval over every window: "
          f"{json.loads(pathlib.Path(args.eval_json).read_text())['mean_nll']:.6f})")
    ok &= math.isclose(nll, strata_nll, rel_tol=1e-4)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
