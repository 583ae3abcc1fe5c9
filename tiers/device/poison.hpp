// The "poison on release" debug knob shared by device buffers and pinned slab leases: released
// memory is filled with kPoisonByte (0xFF: a NaN in every fp32, bf16 and fp16 element), so a
// use-after-release reads NaNs instead of plausible old numbers. STRATA_POISON=1 turns it on for a
// whole test run.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace strata::tiers {

enum class PoisonOnRelease { kOff, kOn, kFromEnvironment };
inline constexpr std::uint8_t kPoisonByte = 0xff;

inline bool poison_enabled(PoisonOnRelease setting) {
  if (setting != PoisonOnRelease::kFromEnvironment) {
    return setting == PoisonOnRelease::kOn;
  }
  const char* value = std::getenv("STRATA_POISON");
  return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

}  // namespace strata::tiers
