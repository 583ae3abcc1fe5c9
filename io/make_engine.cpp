#include "io/make_engine.hpp"

#include <cstdio>

#include "io/posix_engine.hpp"
#include "io/uring_engine.hpp"
#include "io/uring_unavailable.hpp"

namespace strata::io {

std::unique_ptr<Engine> make_engine(const EngineOptions& options) {
  switch (options.kind) {
    case EngineKind::kPosix:
      return std::make_unique<PosixEngine>(options);
    case EngineKind::kIoUring:
      return std::make_unique<UringEngine>(options);
    case EngineKind::kAuto:
      break;
  }
  try {
    return std::make_unique<UringEngine>(options);
  } catch (const UringUnavailable& refused) {
    std::fprintf(stderr, "strata: warning: %s; falling back to the POSIX engine\n", refused.what());
    return std::make_unique<PosixEngine>(options);
  }
}

}  // namespace strata::io
