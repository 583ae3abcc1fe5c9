#include "runtime/comm/communicator.hpp"

#include "base/assert.hpp"

namespace strata::runtime::comm {

const CollectiveStats& CommStats::operator[](Collective collective) const {
  const auto index = static_cast<std::size_t>(collective);
  STRATA_ASSERT(index < kCountedCollectives, "setup is not a counted collective");
  return by_collective[index];
}

std::uint64_t CommStats::total_sent_bytes() const {
  std::uint64_t total = 0;
  for (const auto& stats : by_collective) total += stats.sent_bytes;
  return total;
}

std::uint64_t CommStats::total_payload_bytes() const {
  std::uint64_t total = 0;
  for (const auto& stats : by_collective) total += stats.payload_bytes;
  return total;
}

Chunk chunk_of(std::size_t total, int size, int rank) {
  STRATA_ASSERT(size > 0 && rank >= 0 && rank < size);
  const auto ranks = static_cast<std::size_t>(size);
  const auto index = static_cast<std::size_t>(rank);
  const std::size_t base = total / ranks;
  const std::size_t extra = total % ranks;
  return {index * base + std::min(index, extra), base + (index < extra ? 1 : 0)};
}

void Communicator::count(Collective collective, std::uint64_t payload_bytes,
                         std::uint64_t sent_bytes) {
  auto& stats = stats_.by_collective[static_cast<std::size_t>(collective)];
  ++stats.calls;
  stats.payload_bytes += payload_bytes;
  stats.sent_bytes += sent_bytes;
}

void Communicator::all_gather(ConstBuffer send, MutableBuffer recv) {
  const auto ranks = static_cast<std::size_t>(size());
  STRATA_ASSERT(send.dtype == recv.dtype, "all_gather: send and recv types differ");
  STRATA_ASSERT(recv.count == ranks * send.count,
                "all_gather: recv.count must be size() * send.count");
  STRATA_ASSERT(send.count == 0 || (send.data != nullptr && recv.data != nullptr));
  count(Collective::kAllGather, recv.bytes(), (ranks - 1) * send.bytes());
  do_all_gather(send, recv);
}

void Communicator::reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) {
  const auto ranks = static_cast<std::size_t>(size());
  STRATA_ASSERT(send.dtype == recv.dtype, "reduce_scatter: send and recv types differ");
  STRATA_ASSERT(send.count == ranks * recv.count,
                "reduce_scatter: send.count must be size() * recv.count");
  STRATA_ASSERT(is_valid_reduction(send.dtype, op), "reduce_scatter: avg needs a floating type");
  STRATA_ASSERT(recv.count == 0 || (send.data != nullptr && recv.data != nullptr));
  count(Collective::kReduceScatter, send.bytes(), (ranks - 1) * recv.bytes());
  do_reduce_scatter(send, recv, op);
}

void Communicator::all_reduce(MutableBuffer data, ReduceOp op) {
  STRATA_ASSERT(is_valid_reduction(data.dtype, op), "all_reduce: avg needs a floating type");
  STRATA_ASSERT(data.count == 0 || data.data != nullptr);
  const Chunk own = chunk_of(data.count, size(), rank());
  count(Collective::kAllReduce, data.bytes(),
        size() == 1 ? 0 : 2 * (data.count - own.count) * dtype_bytes(data.dtype));
  do_all_reduce(data, op);
}

void Communicator::broadcast(MutableBuffer data, int root) {
  STRATA_ASSERT(root >= 0 && root < size(), "broadcast: root out of range");
  STRATA_ASSERT(data.count == 0 || data.data != nullptr);
  count(Collective::kBroadcast, data.bytes(), (rank() == root && size() > 1) ? data.bytes() : 0);
  do_broadcast(data, root);
}

std::unique_ptr<PendingAllGather> Communicator::start_all_gather(MutableBuffer recv,
                                                                 std::size_t block,
                                                                 std::uint32_t key,
                                                                 OwnBlock own) {
  const auto ranks = static_cast<std::size_t>(size());
  STRATA_ASSERT(has_pending_all_gathers(), "start_all_gather: the backend has no pending gathers");
  STRATA_ASSERT(key <= max_pending_key(), "start_all_gather: key beyond max_pending_key()");
  STRATA_ASSERT(recv.count == ranks * block, "start_all_gather: recv.count must be size() * count");
  STRATA_ASSERT(block == 0 || recv.data != nullptr);
  count(Collective::kAllGather, recv.bytes(), (ranks - 1) * block * dtype_bytes(recv.dtype));
  return do_start_all_gather(recv, block, key, own);
}

std::optional<std::uint32_t> Communicator::reserve_pending_keys(std::uint32_t count) {
  if (!has_pending_all_gathers() ||
      next_pending_key_ + count > std::uint64_t{max_pending_key()} + 1) {
    return std::nullopt;
  }
  const auto first = static_cast<std::uint32_t>(next_pending_key_);
  next_pending_key_ += count;
  return first;
}

std::unique_ptr<PendingAllGather> Communicator::do_start_all_gather(MutableBuffer, std::size_t,
                                                                    std::uint32_t, OwnBlock) {
  STRATA_ASSERT(false, "start_all_gather on a backend without pending gathers");
  return nullptr;
}

void Communicator::barrier() {
  count(Collective::kBarrier, 0, 0);
  do_barrier();
}

std::uint64_t Communicator::all_reduce_u64(std::uint64_t value, ReduceOp op) {
  all_reduce(std::span<std::uint64_t>(&value, 1), op);
  synchronize();
  return value;
}

float Communicator::all_reduce_f32(float value, ReduceOp op) {
  all_reduce(std::span<float>(&value, 1), op);
  synchronize();
  return value;
}

}  // namespace strata::runtime::comm
