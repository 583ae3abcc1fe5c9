// Shared helpers for the io/ tests: scratch directories, seeded random bytes, and the engine
// configurations (engine x direct) that typed tests run over.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <span>
#include <string>

#include "base/debug_knobs.hpp"
#include "io/aligned_buffer.hpp"
#include "io/engine.hpp"
#include "io/file_handle.hpp"
#include "io/io_error.hpp"
#include "io/posix_engine.hpp"
#include "io/uring_engine.hpp"
#include "io/uring_unavailable.hpp"

namespace strata::io::testing {

// A fresh directory under $STRATA_TEST_TMPDIR (or /tmp), removed with everything in it.
class ScratchDir {
 public:
  ScratchDir() {
    const std::filesystem::path base = test_tmpdir_knob();
    static std::atomic<int> counter{0};
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name =
        "strata-io-" + std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
    if (info != nullptr) {
      name += std::string("-") + info->name();
    }
    for (char& c : name) {
      if (c == '/') {
        c = '_';
      }
    }
    path_ = base / name;
    std::filesystem::create_directories(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void fill_random(std::span<std::byte> bytes, std::uint64_t seed) {
  std::mt19937_64 generator(seed);
  std::size_t i = 0;
  for (; i + 8 <= bytes.size(); i += 8) {
    const std::uint64_t word = generator();
    std::memcpy(bytes.data() + i, &word, 8);
  }
  const std::uint64_t last = generator();
  std::memcpy(bytes.data() + i, &last, bytes.size() - i);
}

// Whether the scratch file system takes O_DIRECT; the reason when it does not.
inline std::string direct_io_refusal(const std::filesystem::path& dir) {
  try {
    FileHandle::open(dir / "probe-direct", {CreateMode::kCreate, DirectIo::kOn});
    std::filesystem::remove(dir / "probe-direct");
    return {};
  } catch (const IoError& error) {
    return error.what();
  }
}

enum class Backend { kIoUring, kPosix };

// The four configurations the typed suites run on.
template <Backend kBackend, DirectIo kDirect>
struct Config {
  static constexpr Backend backend = kBackend;
  static constexpr DirectIo direct = kDirect;
  static std::string name() {
    return std::string(kBackend == Backend::kIoUring ? "io_uring" : "posix") +
           (kDirect == DirectIo::kOn ? "_direct" : "_buffered");
  }
};
using UringDirect = Config<Backend::kIoUring, DirectIo::kOn>;
using UringBuffered = Config<Backend::kIoUring, DirectIo::kOff>;
using PosixDirect = Config<Backend::kPosix, DirectIo::kOn>;
using PosixBuffered = Config<Backend::kPosix, DirectIo::kOff>;
using AllConfigs = ::testing::Types<UringDirect, UringBuffered, PosixDirect, PosixBuffered>;

struct ConfigNames {
  template <class T>
  static std::string GetName(int) {
    return T::name();
  }
};

// Builds the engine a configuration names, or returns null with `skip_reason` set when this
// machine cannot run it (io_uring refused by the kernel, O_DIRECT refused by the file system).
template <class C>
std::unique_ptr<IoEngine> make_test_engine(IoEngineOptions options, const ScratchDir& dir,
                                         std::string& skip_reason) {
  options.direct = C::direct;
  if (C::direct == DirectIo::kOn) {
    if (std::string refusal = direct_io_refusal(dir.path()); !refusal.empty()) {
      skip_reason = "O_DIRECT refused on the scratch directory: " + refusal;
      return nullptr;
    }
  }
  if (C::backend == Backend::kPosix) {
    return std::make_unique<PosixEngine>(options);
  }
  try {
    return std::make_unique<UringEngine>(options);
  } catch (const UringUnavailable& refused) {
    skip_reason = std::string("io_uring refused by this kernel: ") + refused.what();
    return nullptr;
  }
}

}  // namespace strata::io::testing
