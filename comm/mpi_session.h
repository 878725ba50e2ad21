// MpiSession: MPI initialisation and finalisation for one process, plus the failure policy.
//
// MPI is initialised with MPI_THREAD_FUNNELED: OpenMP threads compute inside a rank, but only the
// main thread calls MPI. Constructing a session also installs the terminate handler of abort.h,
// so an exception escaping anywhere aborts the whole job instead of leaving the others hanging.
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

 private:
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace comm
