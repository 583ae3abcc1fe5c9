// Proves the directory-entry operations do what their std::filesystem counterparts do, and that a
// failure is an IoError naming the operation, the path(s) and errno's text.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/io_error.hpp"
#include "io/namespace_ops.hpp"
#include "io/whole_file.hpp"
#include "tests/io/io_test_support.hpp"

namespace strata::io {
namespace {

using ::testing::HasSubstr;
using testing::ScratchDir;

TEST(NamespaceOps, MakeDirectoriesCreatesEveryMissingLevelOnce) {
  ScratchDir dir;
  EXPECT_TRUE(make_directories(dir / "a/b/c"));
  EXPECT_TRUE(std::filesystem::is_directory(dir / "a/b/c"));
  EXPECT_FALSE(make_directories(dir / "a/b/c"));
  write_file_atomically(dir / "file", "x");
  EXPECT_THROW(make_directories(dir / "file/sub"), IoError);
}

TEST(NamespaceOps, RenameReplacesTheTargetAndAMissingSourceNamesBothPaths) {
  ScratchDir dir;
  write_file_atomically(dir / "from", "new");
  write_file_atomically(dir / "to", "old");
  rename_entry(dir / "from", dir / "to");
  const std::vector<std::uint8_t> bytes = read_file_bytes(dir / "to");
  EXPECT_EQ(std::string(bytes.begin(), bytes.end()), "new");
  try {
    rename_entry(dir / "from", dir / "to");
    FAIL() << "renamed a missing file";
  } catch (const IoError& error) {
    EXPECT_THAT(error.what(), HasSubstr((dir / "from").string()));
    EXPECT_THAT(error.what(), HasSubstr((dir / "to").string()));
    EXPECT_THAT(error.what(), HasSubstr("No such file or directory"));
  }
}

TEST(NamespaceOps, RemoveTreeRemovesEverythingAndReportsWhetherThereWasAnything) {
  ScratchDir dir;
  make_directories(dir / "t/x/y");
  write_file_atomically(dir / "t/x/y/f", "1");
  write_file_atomically(dir / "t/g", "2");
  EXPECT_TRUE(remove_tree(dir / "t"));
  EXPECT_FALSE(std::filesystem::exists(dir / "t"));
  EXPECT_FALSE(remove_tree(dir / "t"));
  EXPECT_FALSE(remove_entry(dir / "t"));
  make_directories(dir / "full");
  write_file_atomically(dir / "full/f", "1");
  EXPECT_THROW(remove_entry(dir / "full"), IoError) << "a directory that is not empty";
}

}  // namespace
}  // namespace strata::io
