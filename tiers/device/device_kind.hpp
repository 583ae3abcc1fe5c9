// DeviceKind: which backend a Device runs on. Its own header so the runtime's config can name it
// without pulling in the whole Device interface.
#pragma once

#include <string_view>

namespace strata::tiers {

// kAuto: CUDA when a usable GPU is visible, the host device otherwise (make_device resolves it;
// a Device itself is never kAuto).
enum class DeviceKind { kHost, kCuda, kAuto };
// "host", "cuda" or "auto": the names [tiers.device] kind takes in a config.
std::string_view device_kind_name(DeviceKind kind);

}  // namespace strata::tiers
