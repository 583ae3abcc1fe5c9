// LocalComm: the one-rank communicator. Every collective is a copy (or nothing): all_gather and
// reduce_scatter copy send to recv, all_reduce(sum/max) leaves the data as it is, avg divides by
// one. It runs the same argument checks and statistics as the other backends, so single-process
// runs exercise the Engine's communication code unchanged.
#pragma once

#include "runtime/comm/communicator.hpp"

namespace strata::runtime::comm {

class LocalComm final : public Communicator {
 public:
  LocalComm() = default;

  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view backend_name() const override { return "local"; }

 protected:
  void do_all_gather(ConstBuffer send, MutableBuffer recv) override;
  void do_reduce_scatter(ConstBuffer send, MutableBuffer recv, ReduceOp op) override;
  void do_all_reduce(MutableBuffer data, ReduceOp op) override;
  void do_broadcast(MutableBuffer data, int root) override;
  void do_barrier() override {}
};

}  // namespace strata::runtime::comm
