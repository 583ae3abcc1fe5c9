#!/usr/bin/env python3
"""Compares the training losses of two strata-finetune logs step by step: the reference (the host
device's run) against the candidate (the same run on CUDA). Reads the "step N | loss X | ..." lines,
prints every step whose relative difference |candidate - reference| / |reference| exceeds the
tolerance, a step missing from either log, a loss that is not finite, then one summary line with
the largest difference and its step. Exits 1 on any of those, 0 when every step agrees.
Usage: compare-step-losses.py REFERENCE_LOG CANDIDATE_LOG [--tolerance 0.01] [--steps N]
(--steps: both logs must hold steps 1 to N, so a run cut short fails)."""
import argparse
import math
import re
import sys

# training_run.hpp's print_step: "step    7 | loss 5.1234 | lr ..."; "| val loss" lines do not match.
STEP_LINE = re.compile(r"^step +(\d+) \| loss (\S+) \|")


def step_losses(path):
    """{step: loss} of a log; a step printed twice is an error (a resumed run mixed into the log)."""
    losses = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for number, line in enumerate(f, 1):
            m = STEP_LINE.match(line)
            if not m:
                continue
            step = int(m.group(1))
            if step in losses:
                raise ValueError(f"{path}:{number}: step {step} appears twice")
            losses[step] = float(m.group(2))
    if not losses:
        raise ValueError(f"{path}: no 'step N | loss X' lines")
    return losses


def relative_difference(reference, candidate):
    if reference == candidate:
        return 0.0
    return abs(candidate - reference) / abs(reference) if reference != 0 else math.inf


def compare(reference, candidate, tolerance, steps):
    """Prints each disagreement and the summary; returns the number of disagreeing steps."""
    expected = set(range(1, steps + 1)) if steps else set(reference) | set(candidate)
    problems, worst = 0, None
    for step in sorted(expected | set(reference) | set(candidate)):
        missing = [name for name, log in (("reference", reference), ("candidate", candidate))
                   if step not in log]
        if missing:
            print(f"compare-step-losses: step {step}: missing from the {' and '.join(missing)} log")
            problems += 1
            continue
        a, b = reference[step], candidate[step]
        if not (math.isfinite(a) and math.isfinite(b)):
            print(f"compare-step-losses: step {step}: loss not finite (reference {a}, candidate {b})")
            problems += 1
            continue
        difference = relative_difference(a, b)
        if worst is None or difference > worst[0]:
            worst = (difference, step, a, b)
        if difference > tolerance:
            print(f"compare-step-losses: step {step}: reference {a:.4f}, candidate {b:.4f}, "
                  f"relative difference {100 * difference:.2f}% > {100 * tolerance:g}%")
            problems += 1
    compared = len(set(reference) & set(candidate))
    where = (f"max relative difference {100 * worst[0]:.3f}% at step {worst[1]} (reference "
             f"{worst[2]:.4f}, candidate {worst[3]:.4f})" if worst else "no step in both logs")
    verdict = f"{problems} step(s) beyond {100 * tolerance:g}% or missing" if problems else \
        f"within {100 * tolerance:g}%"
    print(f"compare-step-losses: {compared} steps, {where}, {verdict}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("reference")
    parser.add_argument("candidate")
    parser.add_argument("--tolerance", type=float, default=0.01, help="relative (default 0.01)")
    parser.add_argument("--steps", type=int, default=0, help="both logs must hold steps 1 to N")
    args = parser.parse_args()
    try:
        reference, candidate = step_losses(args.reference), step_losses(args.candidate)
    except (OSError, ValueError) as error:
        print(f"compare-step-losses: {error}")
        return 1
    return 1 if compare(reference, candidate, args.tolerance, args.steps) else 0


if __name__ == "__main__":
    sys.exit(main())
