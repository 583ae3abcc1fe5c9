#include "runtime/comm/local_comm.hpp"

#include <cstring>

namespace strata::runtime::comm {

void LocalComm::do_all_gather(ConstBuffer send, MutableBuffer recv) {
  if (send.count != 0 && send.data != recv.data) std::memmove(recv.data, send.data, send.bytes());
}

void LocalComm::do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) {
  // One row reduced: avg of one value is the value (x / 1 is exact), and it goes through the same
  // code as the multi-rank backends so NaN payloads are normalised identically.
  if (recv.count == 0) return;
  reduce_rows(send.dtype, op, static_cast<const std::byte*>(send.data), send.bytes(), 1, recv.count,
              static_cast<std::byte*>(recv.data));
}

void LocalComm::do_all_reduce(MutableBuffer data, ReduceOp op) {
  if (data.count == 0) return;
  auto* bytes = static_cast<std::byte*>(data.data);
  reduce_rows(data.dtype, op, bytes, data.bytes(), 1, data.count, bytes);
}

void LocalComm::do_broadcast(MutableBuffer /*data*/, int /*root*/) {}

}  // namespace strata::runtime::comm
