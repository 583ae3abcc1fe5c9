#include "io/namespace_ops.hpp"

#include <cerrno>
#include <cstdio>
#include <system_error>
#include <vector>

#include "io/detail/power_loss_hook.hpp"
#include "io/io_error.hpp"

namespace strata::io {
namespace {

[[noreturn]] void raise(const char* operation, const std::filesystem::path& path,
                        const std::error_code& error) {
  throw IoError(operation, path.string(), 0, 0, error.value());
}

}  // namespace

bool make_directories(const std::filesystem::path& path) {
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) return false;
  // One level at a time, so each new directory is reported in its parent.
  if (path.has_parent_path() && path.parent_path() != path) {
    io::make_directories(path.parent_path());
  }
  const bool created = std::filesystem::create_directory(path, error);
  if (error) raise("create directory", path, error);
  if (created) detail::report_create_directory(path);
  return created;
}

void rename_entry(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (std::rename(from.c_str(), to.c_str()) != 0) {
    throw IoError("rename '" + from.string() + "' to", to.string(), 0, 0, errno);
  }
  detail::report_rename(from, to);
}

bool remove_entry(const std::filesystem::path& path) {
  std::error_code error;
  const bool removed = std::filesystem::remove(path, error);
  if (error) raise("remove", path, error);
  if (removed) detail::report_remove(path);
  return removed;
}

bool remove_tree(const std::filesystem::path& path) {
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::symlink_status(path, error);
  if (!std::filesystem::exists(status)) return false;
  if (std::filesystem::is_directory(status)) {
    std::vector<std::filesystem::path> children;
    for (const auto& entry : std::filesystem::directory_iterator(path, error)) {
      children.push_back(entry.path());
    }
    if (error) raise("list directory", path, error);
    for (const std::filesystem::path& child : children) remove_tree(child);
  }
  return remove_entry(path);
}

}  // namespace strata::io
