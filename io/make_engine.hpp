// make_io_engine: the engine that IoEngineOptions::kind asks for, with the `auto` fallback to
// POSIX.
#pragma once

#include <memory>

#include "io/engine.hpp"

namespace strata::io {

// kIoUring: a UringEngine, or UringUnavailable (an IoError with a clear message) when refused.
// kPosix: a PosixEngine. kAuto: a UringEngine, or, when the kernel refuses io_uring (ENOSYS, EPERM,
// EACCES), a PosixEngine after one warning line on stderr.
std::unique_ptr<IoEngine> make_io_engine(const IoEngineOptions& options);

}  // namespace strata::io
