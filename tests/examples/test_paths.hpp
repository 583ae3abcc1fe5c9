// Scratch directory for the GPT tests: $STRATA_TEST_TMPDIR (set by CTest) or /tmp, one
// subdirectory per test, removed by the destructor.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace strata::gpt::testing {

class ScratchDir {
 public:
  ScratchDir() {
    const char* root = std::getenv("STRATA_TEST_TMPDIR");
    const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string leaf = std::string("gpt-") + info->test_suite_name() + "-" + info->name();
    for (char& c : leaf) {
      if (c == '/') {
        c = '_';
      }
    }
    path_ = std::filesystem::path(root != nullptr ? root : "/tmp") / leaf;
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ScratchDir(const ScratchDir&) = delete;
  ScratchDir& operator=(const ScratchDir&) = delete;
  ~ScratchDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

}  // namespace strata::gpt::testing
