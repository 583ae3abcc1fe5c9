// Whole-file reads and atomic whole-file writes for the GPT example's data and checkpoints: the
// runtime's own (runtime/safetensors.hpp), under the example's namespace. Failures throw FileError
// (a std::system_error) naming the operation, the path and errno's text.
#pragma once

#include "runtime/safetensors.hpp"

namespace strata::gpt {

using runtime::FileError;
using runtime::read_file_bytes;
using runtime::write_file_atomically;

}  // namespace strata::gpt
