// Small whole files of a model folder (config.json, an index) read as text, on io/'s file layer
// (io/whole_file.hpp). Errors are io::IoError naming the operation, the path and errno. The
// safetensors files themselves are read by byte range through runtime::SafetensorsReader
// (runtime/checkpoint/safetensors.hpp); outputs are written with io::AtomicFileWriter.
#pragma once

#include <filesystem>
#include <string>

namespace strata::llm {

// A whole small file (config.json, an index) as text.
std::string read_text_file(const std::filesystem::path& path);

}  // namespace strata::llm
