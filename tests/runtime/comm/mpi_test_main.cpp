// main() of the MPI test binary: every rank runs the same tests in the same order on one shared
// MpiComm. Rank 0 prints GoogleTest's usual output; the other ranks print only their own failures,
// prefixed with their rank. The failure count is all-reduced at the end, so a failure on any rank
// makes every rank (and mpirun) exit non-zero.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "tests/runtime/comm/mpi_test_main.hpp"

namespace strata::runtime::comm::mpi_testing {
namespace {

MpiComm* g_world = nullptr;

class RankFailurePrinter final : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}

  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "[rank %d] %s:%d: Failure\n%s\n", rank_,
                 result.file_name() != nullptr ? result.file_name() : "?", result.line_number(),
                 result.message());
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (info.result()->Failed()) {
      std::fprintf(stderr, "[rank %d] [  FAILED  ] %s.%s\n", rank_, info.test_suite_name(),
                   info.name());
    }
  }

 private:
  int rank_;
};

// A timed-out or failed communicator cannot be used again; the other ranks would wait out the
// timeout in every later test. End the job at once instead (the test run fails).
class PoisonWatcher final : public ::testing::EmptyTestEventListener {
 public:
  void OnTestEnd(const ::testing::TestInfo& info) override {
    if (g_world != nullptr && g_world->poisoned()) {
      abort_all(std::string("communicator unusable after test ") + info.test_suite_name() + "." +
                info.name());
    }
  }
};

}  // namespace

MpiComm& world() {
  return *g_world;
}

}  // namespace strata::runtime::comm::mpi_testing

int main(int argc, char** argv) {
  using namespace strata::runtime::comm;
  ::testing::InitGoogleTest(&argc, argv);
  // Long enough for a loaded 2-core CI machine, short enough that a test that desynchronises the
  // ranks fails with a CommTimeoutError well within CTest's TIMEOUT.
  MpiComm comm(CommOptions{std::chrono::seconds(20)});
  mpi_testing::g_world = &comm;
  if (comm.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new mpi_testing::RankFailurePrinter(comm.rank()));
  }
  ::testing::UnitTest::GetInstance()->listeners().Append(new mpi_testing::PoisonWatcher());
  const int gtest_status = RUN_ALL_TESTS();
  const auto local_failures =
      static_cast<std::uint64_t>(::testing::UnitTest::GetInstance()->failed_test_count());
  std::uint64_t failures = 0;
  try {
    failures = comm.all_reduce_u64(local_failures, ReduceOp::kSum);
  } catch (const CommError& error) {
    abort_all(error.what());
  }
  if (failures != 0 && comm.rank() == 0) {
    std::fprintf(stderr, "%llu test failure(s) across %d ranks\n",
                 static_cast<unsigned long long>(failures), comm.size());
  }
  return (failures == 0 && gtest_status == 0) ? 0 : 1;
}
