// UringUnavailable: the kernel refuses io_uring here (not built in, seccomp, io_uring_disabled).
#pragma once

#include "io/io_error.hpp"

namespace strata::io {

class UringUnavailable : public IoError {
 public:
  explicit UringUnavailable(int error_number)
      : IoError("io_uring setup", "", 0, 0, error_number,
                "the kernel refuses io_uring (check kernel.io_uring_disabled and seccomp); "
                "engine = \"posix\" or \"auto\" will use pread/pwrite") {}
};

}  // namespace strata::io
