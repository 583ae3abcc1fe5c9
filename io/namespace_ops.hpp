// Directory-entry operations (create a directory, rename, remove) for the files strata keeps
// beside its data: checkpoint directories and atomic whole-file writes. They exist so every entry
// change goes through io/ (where the power-loss simulator sees it); each throws IoError naming the
// operation, the path(s) and errno's text. None of them fsyncs a directory: callers make entries
// durable with sync_directory (io/whole_file.hpp) when their protocol needs it.
#pragma once

#include <filesystem>

namespace strata::io {

// Creates `path` and any missing parents; true when `path` was created.
bool make_directories(const std::filesystem::path& path);
// rename(2): atomically replaces `to` (a file, or an empty directory) with `from`.
void rename_entry(const std::filesystem::path& from, const std::filesystem::path& to);
// Removes the file or empty directory at `path`; false when there was nothing.
bool remove_entry(const std::filesystem::path& path);
// Removes `path` and everything under it, children before their directory; false when there was
// nothing.
bool remove_tree(const std::filesystem::path& path);

}  // namespace strata::io
