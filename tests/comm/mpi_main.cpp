// main of the multi-rank comm tests: MPI up, GoogleTest on every rank, one verdict for the job.
//
// Exceptions are not caught by GoogleTest, so an error in a collective on one rank aborts the job
// (comm/abort.h) instead of leaving the other ranks blocked. Failed assertions are printed with
// their rank; only rank 0 prints the usual progress. The exit status is the max over all ranks.
#include <mpi.h>

#include <gtest/gtest.h>

#include <cstdio>

#include "comm/abort.h"
#include "comm/mpi_session.h"

namespace {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_,
                 result.file_name() ? result.file_name() : "?", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  GTEST_FLAG_SET(catch_exceptions, false);
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (session.world_rank() != 0) {
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new RankFailurePrinter(session.world_rank()));
  }
  int failed = comm::run_guarded([] { return RUN_ALL_TESTS() == 0 ? 0 : 1; });
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (session.world_rank() == 0 && any_failed) {
    std::fprintf(stderr, "FAILED on at least one rank\n");
  }
  return any_failed;
}
