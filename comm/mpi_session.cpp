#include "comm/mpi_session.h"

#include <mpi.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "comm/abort.h"
#include "core/check.h"

namespace comm {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ENGINE_CHECK(!initialized, "MpiSession: MPI is already initialised");
  int provided = 0;
  // MULTIPLE for the collective watchdog's helper thread (comm/watchdog.h) and for
  // zero.progress: thread (comm/comm_stream.h); FUNNELED suffices otherwise (the watchdog then
  // stays off).
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
  ENGINE_CHECK(rc == MPI_SUCCESS, "MpiSession: MPI_Init_thread failed");
  ENGINE_CHECK(provided >= MPI_THREAD_FUNNELED, "MpiSession: MPI provides thread level " +
                                                    std::to_string(provided) +
                                                    ", MPI_THREAD_FUNNELED is needed");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  install_failure_policy();

  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &node_ranks_);
  MPI_Comm_rank(node, &node_rank_);  // key 0: ordered by world rank, so GPU r is node rank r's
  MPI_Comm_free(&node);
  const char* env = std::getenv("OMP_NUM_THREADS");
  if (env == nullptr || *env == '\0') {
    omp_set_num_threads(std::max(1, omp_get_num_procs() / node_ranks_));
  }
  threads_ = omp_get_max_threads();
}

bool mpi_thread_multiple() {
  int provided = MPI_THREAD_SINGLE;
  MPI_Query_thread(&provided);
  return provided >= MPI_THREAD_MULTIPLE;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  release_failure_policy();
  MPI_Finalize();
}

}  // namespace comm
