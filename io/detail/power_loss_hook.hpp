// The hook through which io/'s file layer reports every mutation to an active PowerLossSimulator
// (io/power_loss_simulator.hpp). Off, each call site costs one atomic load and a branch that is
// never taken: production never installs a simulator.
//
// Each report is made after the real operation succeeded, so the simulator's log mirrors what the
// real file system holds; paths outside the simulator's root are ignored.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>

namespace strata::io {
class PowerLossSimulator;
}

namespace strata::io::detail {

// The installed simulator, or null. Set only by PowerLossSimulator's constructor and destructor.
inline std::atomic<PowerLossSimulator*> g_power_loss{nullptr};

inline PowerLossSimulator* active_power_loss() noexcept {
  return g_power_loss.load(std::memory_order_acquire);
}

// The out-of-line halves, reached only while a simulator is installed.
void record_create_file(PowerLossSimulator& sim, const std::filesystem::path& path);
void record_truncate(PowerLossSimulator& sim, const std::filesystem::path& path);
void record_allocate(PowerLossSimulator& sim, const std::filesystem::path& path,
                     std::uint64_t size_bytes);
void record_write(PowerLossSimulator& sim, const std::filesystem::path& path,
                  std::uint64_t offset_bytes, std::span<const std::byte> bytes);
void record_fsync(PowerLossSimulator& sim, const std::filesystem::path& path);
void record_create_directory(PowerLossSimulator& sim, const std::filesystem::path& path);
void record_rename(PowerLossSimulator& sim, const std::filesystem::path& from,
                   const std::filesystem::path& to);
void record_remove(PowerLossSimulator& sim, const std::filesystem::path& path);

inline void report_create_file(const std::filesystem::path& path) {
  if (PowerLossSimulator* sim = active_power_loss()) record_create_file(*sim, path);
}
inline void report_truncate(const std::filesystem::path& path) {
  if (PowerLossSimulator* sim = active_power_loss()) record_truncate(*sim, path);
}
inline void report_allocate(const std::filesystem::path& path, std::uint64_t size_bytes) {
  if (PowerLossSimulator* sim = active_power_loss()) record_allocate(*sim, path, size_bytes);
}
inline void report_write(const std::filesystem::path& path, std::uint64_t offset_bytes,
                         std::span<const std::byte> bytes) {
  if (PowerLossSimulator* sim = active_power_loss()) record_write(*sim, path, offset_bytes, bytes);
}
// A file's fsync (its data) or a directory's (its entries).
inline void report_fsync(const std::filesystem::path& path) {
  if (PowerLossSimulator* sim = active_power_loss()) record_fsync(*sim, path);
}
inline void report_create_directory(const std::filesystem::path& path) {
  if (PowerLossSimulator* sim = active_power_loss()) record_create_directory(*sim, path);
}
inline void report_rename(const std::filesystem::path& from, const std::filesystem::path& to) {
  if (PowerLossSimulator* sim = active_power_loss()) record_rename(*sim, from, to);
}
inline void report_remove(const std::filesystem::path& path) {
  if (PowerLossSimulator* sim = active_power_loss()) record_remove(*sim, path);
}

}  // namespace strata::io::detail
