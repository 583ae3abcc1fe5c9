#include "runtime/comm/local_comm.hpp"

#include <cstring>

namespace strata::runtime::comm {

void LocalComm::do_all_gather(ConstBuffer send, MutableBuffer recv) {
  if (send.count != 0 && send.data != recv.data) std::memmove(recv.data, send.data, send.bytes());
}

// One rank: sum, max and avg (x / 1 is exact) of a single contribution are the contribution.
void LocalComm::do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp /*op*/) {
  if (recv.count != 0 && send.data != recv.data) std::memmove(recv.data, send.data, recv.bytes());
}

void LocalComm::do_all_reduce(MutableBuffer /*data*/, ReduceOp /*op*/) {}

void LocalComm::do_broadcast(MutableBuffer /*data*/, int /*root*/) {}

}  // namespace strata::runtime::comm
