#include "io/make_engine.hpp"

#include <cstdio>

#include "io/posix_engine.hpp"
#include "io/uring_engine.hpp"
#include "io/uring_unavailable.hpp"

namespace strata::io {

std::unique_ptr<IoEngine> make_io_engine(const IoEngineOptions& options) {
  switch (options.kind) {
    case IoEngineKind::kPosix:
      return std::make_unique<PosixEngine>(options);
    case IoEngineKind::kIoUring:
      return std::make_unique<UringEngine>(options);
    case IoEngineKind::kAuto:
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
