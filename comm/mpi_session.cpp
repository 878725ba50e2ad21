#include "comm/mpi_session.h"

#include <mpi.h>

#include <string>

#include "comm/abort.h"
#include "engine/core/check.h"

namespace comm {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  ENGINE_CHECK(!initialized, "MpiSession: MPI is already initialised");
  int provided = 0;
  int rc = MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  ENGINE_CHECK(rc == MPI_SUCCESS, "MpiSession: MPI_Init_thread failed");
  ENGINE_CHECK(provided >= MPI_THREAD_FUNNELED, "MpiSession: MPI provides thread level " +
                                                    std::to_string(provided) +
                                                    ", MPI_THREAD_FUNNELED is needed");
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  install_abort_on_terminate();
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace comm
