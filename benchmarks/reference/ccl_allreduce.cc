// Reference: oneCCL's allreduce (in place, float32, sum) through its C++ API, launched by Intel
// MPI's mpiexec (MPI only passes the key-value store's address around). `make peers` builds it
// from PyPI's wheels (oneccl-cpu 2022.1.2); CCL_ATL_TRANSPORT=ofi CCL_ATL_SHM=1 FI_PROVIDER=shm
// runs oneCCL's own algorithms over shared memory, the default transport Intel MPI's. The first
// result is checked (exit status non-zero if it is wrong).
//
//   mpiexec -n 2 ccl_allreduce BYTES ITERS [ROUNDS]   -> milliseconds per op (median round)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <oneapi/ccl.hpp>
#include <vector>

int main(int argc, char** argv) {
  ccl::init();
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 3) {
    if (rank == 0) std::fprintf(stderr, "usage: %s BYTES ITERS [ROUNDS]\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  ccl::shared_ptr_class<ccl::kvs> kvs;
  ccl::kvs::address_type address;
  if (rank == 0) {
    kvs = ccl::create_main_kvs();
    address = kvs->get_address();
  }
  MPI_Bcast(address.data(), static_cast<int>(address.size()), MPI_BYTE, 0, MPI_COMM_WORLD);
  if (rank != 0) kvs = ccl::create_kvs(address);
  ccl::communicator comm = ccl::create_communicator(size, rank, kvs);

  const size_t count = std::strtoull(argv[1], nullptr, 10) / 4;
  const int iters = std::max(1, std::atoi(argv[2]));
  const int roundsWanted = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  std::vector<float> buffer(std::max<size_t>(count, 1), 1.0f);
  ccl::allreduce(buffer.data(), buffer.data(), count, ccl::reduction::sum, comm).wait();
  for (size_t i = 0; i < count; ++i) {
    if (buffer[i] != static_cast<float>(size)) {
      std::fprintf(stderr, "rank %d: element %zu is %f after the first allreduce of ones\n", rank,
                   i, buffer[i]);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  std::vector<double> rounds;
  for (int r = 0; r < roundsWanted; ++r) {
    ccl::barrier(comm).wait();
    const double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      ccl::allreduce(buffer.data(), buffer.data(), count, ccl::reduction::sum, comm).wait();
    }
    ccl::barrier(comm).wait();
    rounds.push_back((MPI_Wtime() - t0) / iters);
  }
  std::sort(rounds.begin(), rounds.end());
  // Marked and on a line of its own: another rank's warnings may reach the same pipe unfinished.
  if (rank == 0) std::printf("\nms_per_op %.6f\n", rounds[rounds.size() / 2] * 1e3);
  MPI_Finalize();
  return 0;
}
