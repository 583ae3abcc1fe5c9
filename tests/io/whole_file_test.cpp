// Proves the whole-file layer: reads give every byte, atomic writes (whole or streamed) replace a
// file whole (or leave it untouched and no temporary behind on failure or abandonment), and every
// error names the path and errno.
#include "io/whole_file.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io_test_support.hpp"

namespace strata::io {
namespace {

using testing::ScratchDir;

std::vector<std::uint8_t> bytes_of(const std::string& text) {
  return {text.begin(), text.end()};
}

void write_in_two_chunks(const std::filesystem::path& path, const std::string& first,
                         const std::string& second) {
  const std::vector<std::uint8_t> a = bytes_of(first);
  const std::vector<std::uint8_t> b = bytes_of(second);
  const std::span<const std::uint8_t> chunks[] = {a, b};
  write_file_atomically(path, chunks);
}

TEST(WholeFileTest, AtomicWriteThenReadRoundTrips) {
  ScratchDir dir;
  write_in_two_chunks(dir / "file.bin", "hello, ", "world");
  EXPECT_EQ(read_file_bytes(dir / "file.bin"), bytes_of("hello, world"));
  write_in_two_chunks(dir / "file.bin", "", "x");  // replaces, never appends
  EXPECT_EQ(read_file_bytes(dir / "file.bin"), bytes_of("x"));
  EXPECT_FALSE(std::filesystem::exists(dir / "file.bin.tmp"));
  write_in_two_chunks(dir / "empty.bin", "", "");
  EXPECT_TRUE(read_file_bytes(dir / "empty.bin").empty());
  write_file_atomically(dir / "file.bin", std::string_view("text\0bytes", 10));  // one block
  EXPECT_EQ(read_file_bytes(dir / "file.bin"), bytes_of(std::string("text\0bytes", 10)));
}

TEST(WholeFileTest, StreamedWriteIsInvisibleUntilCommit) {
  ScratchDir dir;
  write_in_two_chunks(dir / "file.bin", "old", "");
  AtomicFileWriter writer = AtomicFileWriter::create(dir / "file.bin");
  const std::string parts[] = {"new ", "", "bytes"};
  for (const std::string& part : parts) writer.append(std::as_bytes(std::span(part)));
  EXPECT_EQ(writer.written_bytes(), 9u);
  EXPECT_EQ(read_file_bytes(dir / "file.bin"), bytes_of("old")) << "visible before commit";
  writer.commit();
  EXPECT_EQ(read_file_bytes(dir / "file.bin"), bytes_of("new bytes"));
  EXPECT_FALSE(std::filesystem::exists(dir / "file.bin.tmp"));
}

TEST(WholeFileTest, AbandonedStreamedWriteLeavesTargetAndNoTemporary) {
  ScratchDir dir;
  write_in_two_chunks(dir / "file.bin", "old", "");
  {
    AtomicFileWriter writer = AtomicFileWriter::create(dir / "file.bin");
    AtomicFileWriter moved = std::move(writer);  // the moved-from writer owns nothing to remove
    moved.append(std::as_bytes(std::span(std::string_view("partial"))));
    EXPECT_TRUE(std::filesystem::exists(dir / "file.bin.tmp"));
  }
  EXPECT_EQ(read_file_bytes(dir / "file.bin"), bytes_of("old"));
  EXPECT_FALSE(std::filesystem::exists(dir / "file.bin.tmp")) << "the temporary file was left";
}

TEST(WholeFileTest, MissingFileNamesPathAndErrno) {
  ScratchDir dir;
  try {
    read_file_bytes(dir / "absent.bin");
    FAIL() << "read a missing file";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
    EXPECT_EQ(error.path(), (dir / "absent.bin").string());
    EXPECT_NE(std::string(error.what()).find("No such file"), std::string::npos) << error.what();
  }
}

TEST(WholeFileTest, DirectoryIsNotAFileToRead) {
  ScratchDir dir;
  try {
    read_file_bytes(dir.path());
    FAIL() << "read a directory as a file";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), EISDIR);
    EXPECT_NE(std::string(error.what()).find(dir.path().string()), std::string::npos);
  }
}

TEST(WholeFileTest, FailedRenameLeavesTargetAndNoTemporary) {
  ScratchDir dir;
  // A non-empty directory cannot be replaced by a file: the rename fails after the data is written.
  std::filesystem::create_directories(dir / "target" / "inside");
  try {
    write_in_two_chunks(dir / "target", "new ", "bytes");
    FAIL() << "renamed a file over a directory";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), EISDIR) << error.what();
    EXPECT_NE(std::string(error.what()).find("rename"), std::string::npos) << error.what();
  }
  EXPECT_TRUE(std::filesystem::is_directory(dir / "target" / "inside"));
  EXPECT_FALSE(std::filesystem::exists(dir / "target.tmp")) << "the temporary file was left";
}

TEST(WholeFileTest, WriteIntoMissingDirectoryNamesTheTemporaryPath) {
  ScratchDir dir;
  try {
    write_in_two_chunks(dir / "no-such-dir" / "file.bin", "a", "b");
    FAIL() << "wrote into a missing directory";
  } catch (const IoError& error) {
    EXPECT_EQ(error.code().value(), ENOENT);
    EXPECT_EQ(error.path(), (dir / "no-such-dir" / "file.bin.tmp").string());
  }
}

TEST(WholeFileTest, SyncDirectoryNamesAMissingDirectory) {
  ScratchDir dir;
  sync_directory(dir.path());
  EXPECT_THROW(sync_directory(dir / "absent"), IoError);
}

}  // namespace
}  // namespace strata::io
