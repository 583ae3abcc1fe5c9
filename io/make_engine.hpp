// make_engine: the engine that EngineOptions::kind asks for, with the `auto` fallback to POSIX.
#pragma once

#include <memory>

#include "io/engine.hpp"

namespace strata::io {

// kIoUring: a UringEngine, or UringUnavailable (an IoError with a clear message) when refused.
// kPosix: a PosixEngine. kAuto: a UringEngine, or, when the kernel refuses io_uring (ENOSYS, EPERM,
// EACCES), a PosixEngine after one warning line on stderr.
std::unique_ptr<Engine> make_engine(const EngineOptions& options);

}  // namespace strata::io
