#include <cstdlib>

#include "runtime/comm/communicator.hpp"
#include "runtime/comm/local_comm.hpp"
#include "runtime/comm/mpi_comm.hpp"

namespace strata::runtime::comm {

bool launched_by_mpirun() {
  // Open MPI's mpirun sets OMPI_COMM_WORLD_SIZE; PMIx launchers (srun --mpi=pmix, prterun) set
  // PMIX_RANK.
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr;
}

std::unique_ptr<Communicator> make_communicator(const CommOptions& options) {
  if (!launched_by_mpirun()) return std::make_unique<LocalComm>();
  return std::make_unique<MpiComm>(options);
}

}  // namespace strata::runtime::comm
