// How the optimizer keeps its state in memory and on NVMe: the master weights in fp32 or bf16, the
// moments in fp32, bf16 or 8-bit blocks. The byte layout defined here is what the NVMe store, the
// host tier and checkpoints hold, so it is a file format: change it only with a version bump.
//
// int8 moments (blockwise dynamic quantization, as in bitsandbytes / torchao AdamW8bit):
//  - A sub-group of n elements is ceil(n / kQuantBlockElems) blocks of kQuantBlockBytes bytes:
//    an fp32 scale (the block's absmax, little-endian) then kQuantBlockElems one-byte codes; the
//    last block's unused codes are zero. Blocks start at the sub-group's first element.
//  - 1020 codes + 4 bytes = 1 KiB, so four blocks fill a 4 KiB O_DIRECT page exactly and no block
//    straddles a page or a sub-group.
//  - exp_avg (signed; Adam's m, Lion's m): code q in [-127, 127],
//      value = scale * (q * |q|) / 127^2          (a square-law code: fine steps near zero).
//  - exp_avg_sq (non-negative; Adam's v, Adagrad's sum): code c in [0, 255],
//      value = scale * (c / 255)^4                (sqrt(v) gets a square-law code: Adam divides
//                                                  by sqrt(v), so its relative error is what
//                                                  counts).
//  - Encoding picks the code nearest in the companded domain (sqrt(|m|/scale) * 127,
//    (v/scale)^(1/4) * 255), rounding half up; the decoded value is then one of the two codes that
//    bracket the true value. (step_compressed computes exp_avg_sq's position from the sqrt(v) its
//    update took, a few ulp from encode_state's: same guarantee.)
//  - Decoding multiplies by the fp32 reciprocals of 127^2 and 255 (their products with 127^2 and
//    255 are exactly 1, so the top codes decode to the scale itself).
// bf16 master weights are rounded stochastically by the optimizer (unbiased; see
// compressed_step.hpp) and to nearest even when written from fp32 (checkpoint load, import).
// A Kahan-compensated bf16 master ([optimizer] master_rounding = "kahan") is two bf16 arrays of
// the same length, the weights and their low parts ("compensation"); the value is their fp32 sum.
// The weights are the value rounded to nearest even; the low part is the rest, cut toward zero.
// So |low| <= half a unit in the last place of the weight, the sum is exact in fp32 (16
// significant bits at most), and split(join(w, low)) = (w, low).
#pragma once

#include <cstddef>
#include <cstdint>

#include <oneapi/tbb/task_arena.h>

#include "cpu_adam/exec_options.hpp"
#include "cpu_adam/state_dtype.hpp"

namespace strata::cpu_adam {

// Elements numel in `dtype` as fp32 (decode) and back (encode: bf16 to nearest even; int8 by the
// block code of `moment`). `encoded` holds state_bytes(dtype, numel) bytes. The encoding of
// encode(decode(x)) is x itself (int8 codes and scales are fixed points). Work runs in `arena`;
// bitwise the same for every thread count and SIMD level.
void decode_state(StateDType dtype, MomentKind moment, const std::byte* encoded,
                  std::uint64_t numel, float* values, tbb::task_arena& arena,
                  const ExecOptions& options = {});
void encode_state(StateDType dtype, MomentKind moment, const float* values, std::uint64_t numel,
                  std::byte* encoded, tbb::task_arena& arena, const ExecOptions& options = {});

// The compensated master (above): values[i] += low[i] (values holding the weights as fp32; a
// zero low leaves them as they are), and the split of fp32 values into weights and low parts
// (a zero low is +0). Bitwise the step's own join and split.
void add_compensation(const std::byte* low, std::uint64_t numel, float* values,
                      tbb::task_arena& arena, const ExecOptions& options = {});
void split_compensated(const float* values, std::uint64_t numel, std::byte* weights,
                       std::byte* low, tbb::task_arena& arena, const ExecOptions& options = {});

}  // namespace strata::cpu_adam
