#pragma once
// This process's rank and the number of ranks in MPI_COMM_WORLD.
#include <mpi.h>

namespace mhla::test {

inline int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

inline int world_size() {
  int r = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &r);
  return r;
}

}  // namespace mhla::test
