// Proves FileHandle opens, preallocates, syncs and closes files, and that its errors name the path,
// the operation and the errno text (with the `direct = false` hint where O_DIRECT is refused).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/vfs.h>

#include <cerrno>
#include <string>

#include "io_test_support.hpp"

namespace strata::io {
namespace {

using testing::ScratchDir;

TEST(FileHandleTest, CreatesAndPreallocates) {
  ScratchDir dir;
  FileHandle file = FileHandle::open(dir / "alloc.bin", {CreateMode::kCreate, DirectIo::kOff});
  ASSERT_TRUE(file.valid());
  EXPECT_FALSE(file.direct());
  file.allocate(3 * kMiB);
  EXPECT_EQ(file.size_bytes(), 3 * kMiB);
  file.allocate(kMiB);  // never shrinks
  EXPECT_EQ(file.size_bytes(), 3 * kMiB);
  file.sync();
  EXPECT_EQ(file.path(), (dir / "alloc.bin").string());
}

TEST(FileHandleTest, MoveTransfersTheDescriptor) {
  ScratchDir dir;
  FileHandle first = FileHandle::open(dir / "move.bin", {CreateMode::kCreate, DirectIo::kOff});
  const int fd = first.fd();
  FileHandle second = std::move(first);
  EXPECT_FALSE(
      first.valid());  // NOLINT(bugprone-use-after-move): the moved-from state is the point
  EXPECT_EQ(second.fd(), fd);
  second = FileHandle();
  EXPECT_EQ(::fcntl(fd, F_GETFD), -1) << "the descriptor was not closed";
}

TEST(FileHandleTest, MissingFileErrorNamesPathAndErrno) {
  ScratchDir dir;
  try {
    FileHandle::open(dir / "missing.bin", {CreateMode::kOpenExisting, DirectIo::kOff});
    FAIL() << "expected IoError";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
    EXPECT_EQ(error.operation(), "open");
    const std::string what = error.what();
    EXPECT_NE(what.find("missing.bin"), std::string::npos) << what;
    EXPECT_NE(what.find("No such file or directory"), std::string::npos) << what;
  }
}

TEST(FileHandleTest, RefusedDirectIoSaysDirectFalseWillWork) {
  // Needs a file system that refuses O_DIRECT. tmpfs did before Linux 6.6; try the usual mounts.
  for (const char* candidate : {"/dev/shm", "/run", "/tmp"}) {
    std::error_code ignored;
    if (!std::filesystem::is_directory(candidate, ignored)) {
      continue;
    }
    const std::filesystem::path path =
        std::filesystem::path(candidate) / ("strata-direct-probe-" + std::to_string(::getpid()));
    try {
      FileHandle::open(path, {CreateMode::kCreate, DirectIo::kOn});
      std::filesystem::remove(path, ignored);
    } catch (const IoError& error) {
      std::filesystem::remove(path, ignored);
      if (error.code().value() != EINVAL) {
        continue;
      }
      const std::string what = error.what();
      EXPECT_NE(what.find(path.string()), std::string::npos) << what;
      EXPECT_NE(what.find("direct = false"), std::string::npos) << what;
      // And buffered works there.
      FileHandle buffered = FileHandle::open(path, {CreateMode::kCreate, DirectIo::kOff});
      std::filesystem::remove(path, ignored);
      return;
    }
  }
  GTEST_SKIP() << "no file system here refuses O_DIRECT (tmpfs takes it since Linux 6.6)";
}

}  // namespace
}  // namespace strata::io
