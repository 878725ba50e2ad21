// MpiSession: MPI initialisation and finalisation for one process, plus the failure policy.
//
// MPI is initialised asking for MPI_THREAD_MULTIPLE (at least MPI_THREAD_FUNNELED is required):
// OpenMP threads compute inside a rank without calling MPI; a communication thread
// (comm/comm_stream.h) may run collectives on its own communicator next to the main thread.
// Constructing a session also installs the failure policy of abort.h (the communicator the ranks
// agree on errors over, and the terminate handler), so an error anywhere ends the whole job
// instead of leaving the others hanging.
//
// Threads per rank: unless OMP_NUM_THREADS is set, the session divides this node's processors
// among the ranks on it (at least one each). OpenMP and MPI both spin while they wait, so
// ranks x threads beyond the processors is ruinous: the tiny config at np 4 on 2 cores ran
// 3.8 s per step with 2 threads per rank and 84 ms with 1.
#pragma once

namespace comm {

class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();  // MPI_Finalize; destroy every communicator first
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  int node_ranks() const { return node_ranks_; }  // ranks sharing this node's memory
  int node_rank() const { return node_rank_; }    // this rank's place among them (0-based)
  int threads_per_rank() const { return threads_; }

 private:
  int rank_ = 0;
  int size_ = 1;
  int node_ranks_ = 1;
  int node_rank_ = 0;
  int threads_ = 1;
};

// Whether MPI provides MPI_THREAD_MULTIPLE (MPI must be initialised).
bool mpi_thread_multiple();

}  // namespace comm
