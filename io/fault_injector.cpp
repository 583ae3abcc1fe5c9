#include "io/fault_injector.hpp"

#include <utility>

#include "base/units.hpp"

namespace strata::io {

void FaultInjector::add(FaultRule rule) {
  std::lock_guard lock(mutex_);
  rules_.push_back(std::move(rule));
}

void FaultInjector::clear() {
  std::lock_guard lock(mutex_);
  rules_.clear();
  events_.clear();
  ring_setup_error_.reset();
}

void FaultInjector::fail_ring_setup(int error_number) {
  std::lock_guard lock(mutex_);
  ring_setup_error_ = error_number;
}

std::optional<int> FaultInjector::take_ring_setup_error() {
  std::lock_guard lock(mutex_);
  return std::exchange(ring_setup_error_, std::nullopt);
}

std::int64_t FaultInjector::on_complete(IoOp op, std::string_view path, std::uint64_t offset_bytes,
                                        std::span<std::byte> buffer, std::size_t alignment,
                                        std::int64_t result) {
  std::lock_guard lock(mutex_);
  const std::uint64_t number = ++operations_;
  for (FaultRule& rule : rules_) {
    if (rule.times == 0 || (rule.nth_operation && *rule.nth_operation != number) ||
        (rule.op && *rule.op != op) ||
        (!rule.path_contains.empty() && path.find(rule.path_contains) == std::string_view::npos)) {
      continue;
    }
    std::int64_t injected = result;
    switch (rule.kind) {
      case FaultKind::kFailErrno:
        injected = -rule.error_number;
        break;
      case FaultKind::kShortTransfer: {
        const auto halved = static_cast<std::int64_t>(
            round_down(static_cast<std::uint64_t>(result > 0 ? result : 0) / 2, alignment));
        if (halved <= 0) {
          continue;  // too small to shorten while keeping alignment: stay armed
        }
        injected = halved;
        break;
      }
      case FaultKind::kFlipByteOnRead:
        if (op != IoOp::kRead || result <= 0) {
          continue;
        }
        buffer[static_cast<std::size_t>(result) / 2] ^= std::byte{0xFF};
        break;
    }
    --rule.times;
    events_.push_back({rule.kind, op, std::string(path), offset_bytes, number});
    return injected;
  }
  return result;
}

std::uint64_t FaultInjector::operations() const {
  std::lock_guard lock(mutex_);
  return operations_;
}

std::vector<FaultEvent> FaultInjector::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

}  // namespace strata::io
