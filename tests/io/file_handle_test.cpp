// Proves FileHandle opens, preallocates, reads, writes, locks, syncs and closes files, and that its
// errors name the path, the operation, the offset and the errno text (with the `direct = false` hint
// where O_DIRECT is refused).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/vfs.h>

#include <cerrno>
#include <string>
#include <vector>

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

TEST(FileHandleTest, WriteAtThenReadAtRoundTripsAndStopsAtTheEnd) {
  ScratchDir dir;
  const FileHandle file =
      FileHandle::open(dir / "rw.bin", {CreateMode::kCreateTruncate, DirectIo::kOff});
  std::vector<std::byte> written(10000);
  testing::fill_random(written, 5);
  file.write_at(100, written);
  EXPECT_EQ(file.size_bytes(), 10100u);
  std::vector<std::byte> read(10000);
  EXPECT_EQ(file.read_at(100, read), 10000u);
  EXPECT_EQ(read, written);
  std::vector<std::byte> past_end(500);
  EXPECT_EQ(file.read_at(9800, past_end), 300u) << "read_at must stop where the file ends";
  EXPECT_TRUE(file.is_regular_file());
}

TEST(FileHandleTest, ReadOnlyOpenRefusesWritesNamingOffsetAndErrno) {
  ScratchDir dir;
  FileHandle::open(dir / "ro.bin", {CreateMode::kCreate, DirectIo::kOff});
  const FileHandle file =
      FileHandle::open(dir / "ro.bin", {CreateMode::kCreate, DirectIo::kOff, Access::kReadOnly});
  const std::vector<std::byte> bytes(64);
  try {
    file.write_at(4096, bytes);
    FAIL() << "wrote through a read-only handle";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), EBADF);
    EXPECT_EQ(error.operation(), "write");
    EXPECT_EQ(error.offset_bytes(), 4096u);
    EXPECT_EQ(error.length_bytes(), 64u);
    EXPECT_NE(std::string(error.what()).find("ro.bin"), std::string::npos) << error.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "never.bin"));
  EXPECT_THROW(FileHandle::open(dir / "never.bin", {CreateMode::kCreate, DirectIo::kOff,
                                                    Access::kReadOnly}),
               IoError)
      << "a read-only open must never create the file";
}

TEST(FileHandleTest, ExclusiveLockIsHeldUntilTheHandleCloses) {
  ScratchDir dir;
  const OpenOptions options{CreateMode::kCreate, DirectIo::kOff};
  FileHandle first = FileHandle::open(dir / "lock", options);
  const FileHandle second = FileHandle::open(dir / "lock", options);
  EXPECT_TRUE(first.try_lock_exclusive());
  EXPECT_FALSE(second.try_lock_exclusive());
  first = FileHandle();
  EXPECT_TRUE(second.try_lock_exclusive());
}

TEST(FileHandleTest, DirectoryOpensAndSyncs) {
  ScratchDir dir;
  const FileHandle directory = FileHandle::open_directory(dir.path());
  EXPECT_FALSE(directory.is_regular_file());
  directory.sync();
  try {
    FileHandle::open_directory(dir / "absent");
    FAIL() << "opened a missing directory";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
    EXPECT_EQ(error.operation(), "open directory");
  }
}

}  // namespace
}  // namespace strata::io
