// The "poison on release" debug knob shared by device buffers and pinned slab leases: released
// memory is filled with kPoisonByte (0xFF: a NaN in every fp32, bf16 and fp16 element), so a
// use-after-release reads NaNs instead of plausible old numbers. STRATA_POISON=1 turns it on for a
// whole test run (base/debug_knobs.hpp; any value but unset, empty, 0 or 1 is a KnobError).
#pragma once

#include <cstdint>

#include "base/debug_knobs.hpp"

namespace strata::tiers {

enum class PoisonOnRelease { kOff, kOn, kFromEnvironment };
inline constexpr std::uint8_t kPoisonByte = 0xff;

inline bool poison_enabled(PoisonOnRelease setting) {
  if (setting != PoisonOnRelease::kFromEnvironment) {
    return setting == PoisonOnRelease::kOn;
  }
  return poison_device_knob();
}

}  // namespace strata::tiers
