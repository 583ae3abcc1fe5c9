// The MPI test binary's shared communicator (created by its main before the tests run).
#pragma once

#include "runtime/comm/mpi_comm.hpp"

namespace strata::runtime::comm::mpi_testing {

MpiComm& world();

}  // namespace strata::runtime::comm::mpi_testing
