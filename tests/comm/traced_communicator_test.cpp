// TracedCommunicator on MPI: results and counters are the wrapped communicator's; while its tracer
// is active a blocking collective is a span on the calling thread, an async one a span from
// issue to completion on the thread's in-flight track plus its wait; inactive, nothing is
// recorded; a split is traced too, and set_blocking_async reaches the wrapped communicator.
#include "comm/traced_communicator.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace {

comm::Communicator& world() {
  static std::unique_ptr<comm::Communicator> w = comm::make_mpi_world();
  return *w;
}

// Span name -> its track's name.
std::multimap<std::string, std::string> spans_by_track(const core::Tracer& tracer) {
  const std::vector<core::TraceTrack> tracks = tracer.tracks();
  std::multimap<std::string, std::string> out;
  for (const core::TraceSpan& s : tracer.spans())
    out.emplace(s.name, tracks[s.track].name);
  return out;
}

TEST(TracedCommunicator, RecordsCollectivesWhileActive) {
  core::Tracer tracer;
  comm::TracedCommunicator traced(world(), tracer);
  const int W = traced.size();
  std::vector<float> x(5, 1.0f);
  traced.all_reduce(x.data(), 5, comm::ReduceOp::Sum);  // inactive: not recorded
  EXPECT_TRUE(tracer.spans().empty());
  EXPECT_EQ(x[0], static_cast<float>(W));

  const int64_t calls = world().stats()[comm::Collective::AllReduce].calls;
  tracer.set_active(true);
  traced.all_reduce(x.data(), 5, comm::ReduceOp::Sum);
  std::unique_ptr<comm::Work> work = traced.all_reduce_async(x.data(), 5, comm::ReduceOp::Sum);
  work->wait();
  traced.barrier();
  tracer.set_active(false);
  EXPECT_EQ(x[0], static_cast<float>(W * W * W));
  EXPECT_EQ(&traced.stats(), &world().stats());
  EXPECT_EQ(world().stats()[comm::Collective::AllReduce].calls, calls + 2);

  const auto spans = spans_by_track(tracer);
  ASSERT_EQ(spans.count("all_reduce"), 2u);
  auto range = spans.equal_range("all_reduce");
  std::multiset<std::string> tracks;
  for (auto it = range.first; it != range.second; ++it)
    tracks.insert(it->second);
  EXPECT_EQ(tracks, (std::multiset<std::string>{"main", "main in flight"}));
  ASSERT_EQ(spans.count("wait all_reduce"), 1u);
  EXPECT_EQ(spans.find("wait all_reduce")->second, "main");
  EXPECT_EQ(spans.count("barrier"), 1u);
}

TEST(TracedCommunicator, SplitIsTracedAndBlockingAsyncIsPassedOn) {
  core::Tracer tracer;
  comm::TracedCommunicator traced(world(), tracer);
  std::unique_ptr<comm::Communicator> sub = traced.split(0, traced.rank());
  sub->set_blocking_async(true);
  tracer.set_active(true);
  std::vector<float> x(3, 2.0f);
  std::unique_ptr<comm::Work> work = sub->all_reduce_async(x.data(), 3, comm::ReduceOp::Max);
  // The wrapped MPI communicator ran the blocking collective: the Work is complete at once.
  EXPECT_TRUE(work->test());
  work->wait();
  tracer.set_active(false);
  EXPECT_EQ(x[0], 2.0f);
  const auto spans = spans_by_track(tracer);
  ASSERT_EQ(spans.count("all_reduce"), 1u);
  EXPECT_EQ(spans.find("all_reduce")->second, "main");  // recorded as the blocking call it was
  EXPECT_EQ(spans.count("wait all_reduce"), 0u);
}

}  // namespace
