// Reference: MPI_Allreduce (in place, float32, sum) of the installed MPI, e.g. Debian's Open MPI
// (apt-get install openmpi-bin libopenmpi-dev), or Intel MPI (`make peers`). The first result is
// checked (exit status non-zero if it is wrong).
//
//   mpirun -np 2 mpi_allreduce BYTES ITERS [ROUNDS]   -> milliseconds per op (median round)
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 3) {
    if (rank == 0) std::fprintf(stderr, "usage: %s BYTES ITERS [ROUNDS]\n", argv[0]);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int count = static_cast<int>(std::strtoull(argv[1], nullptr, 10) / 4);
  const int iters = std::max(1, std::atoi(argv[2]));
  const int roundsWanted = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  std::vector<float> buffer(std::max(count, 1), 1.0f);
  MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  for (int i = 0; i < count; ++i) {
    if (buffer[i] != static_cast<float>(size)) {
      std::fprintf(stderr, "rank %d: element %d is %f after the first allreduce of ones\n", rank, i,
                   buffer[i]);
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
  }
  std::vector<double> rounds;
  for (int r = 0; r < roundsWanted; ++r) {
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(MPI_IN_PLACE, buffer.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    rounds.push_back((MPI_Wtime() - t0) / iters);
  }
  std::sort(rounds.begin(), rounds.end());
  // Marked and on a line of its own: another rank's warnings may reach the same pipe unfinished.
  if (rank == 0) std::printf("\nms_per_op %.6f\n", rounds[rounds.size() / 2] * 1e3);
  MPI_Finalize();
  return 0;
}
