// core::Tracer: spans only while active, tracks per thread, the Chrome trace-event JSON (parsed
// back with core's JSON reader) and the lanes of overlapping tracks.
#include "core/tracer.h"

#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "core/json.h"
#include "tests/core/allocation_counter.h"

namespace {

// The events of chrome_trace_events as parsed JSON.
core::JsonValue events_of(const core::Tracer& tracer, int pid) {
  std::string text = "[";
  text += core::chrome_trace_events(tracer, pid, "rank 0", 0.0);
  text += "]";
  return core::parse_json(text, "trace");
}

TEST(Tracer, RecordsOnlyWhileActive) {
  core::Tracer tracer;
  { core::TraceScope off(&tracer, "phase", "before"); }
  { core::TraceScope none(nullptr, "phase", "no tracer"); }
  tracer.set_active(true);
  { core::TraceScope on(&tracer, "phase", "step", 3); }
  { core::TraceScope layer(&tracer, "layer", "block", -1); }
  tracer.set_active(false);
  { core::TraceScope after(&tracer, "phase", "after"); }
  const std::vector<core::TraceSpan> spans = tracer.spans();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(spans[0].name, "step 3");
  EXPECT_EQ(spans[1].name, "block -1");  // a layer index below 0 is still an index
  EXPECT_EQ(spans[0].track, 0);
  EXPECT_LE(spans[0].begin_us, spans[0].end_us);
  EXPECT_LE(spans[0].end_us, spans[1].begin_us);
}

// Tracing off costs a branch: no tracer, or an inactive one, allocates nothing.
TEST(Tracer, InactiveScopesDoNotAllocate) {
  core::Tracer tracer;
  const long before = test_util::allocations();
  for (int i = 0; i < 100; ++i) {
    core::TraceScope none(nullptr, "layer", "forward block", i);
    core::TraceScope idle(&tracer, "comm", "all_reduce");
  }
  EXPECT_EQ(test_util::allocations(), before);
  tracer.set_active(true);
  { core::TraceScope on(&tracer, "layer", "forward block", 1); }
  EXPECT_GT(test_util::allocations(), before);  // the counter sees the allocations of a record
  EXPECT_EQ(tracer.spans().size(), 1u);
}

TEST(Tracer, ThreadsGetTheirOwnTracks) {
  core::Tracer tracer;
  tracer.set_active(true);
  std::thread worker([&] {
    tracer.name_thread("comm thread");
    core::TraceScope span(&tracer, "comm", "all_reduce");
  });
  worker.join();
  { core::TraceScope span(&tracer, "phase", "main work"); }
  const std::vector<core::TraceTrack> tracks = tracer.tracks();
  ASSERT_EQ(tracks.size(), 2u);
  EXPECT_EQ(tracks[0].name, "main");
  EXPECT_EQ(tracks[1].name, "comm thread");
  std::map<std::string, int> track_of;
  for (const core::TraceSpan& s : tracer.spans())
    track_of[s.name] = s.track;
  EXPECT_EQ(track_of.at("all_reduce"), 1);
  EXPECT_EQ(track_of.at("main work"), 0);
  EXPECT_EQ(tracer.in_flight_track(), tracer.in_flight_track());
  EXPECT_EQ(tracer.tracks().back().name, "main in flight");
}

TEST(Tracer, ChromeEventsSpreadOverlappingSpansOverLanes) {
  core::Tracer tracer;
  const int flight = tracer.in_flight_track();
  const int device = tracer.named_track("device");
  // Three collectives in flight: [0, 10], [5, 20] overlap, [12, 30] fits after the first.
  tracer.record("all_reduce", core::kNoIndex, "comm", flight, 100, 110);
  tracer.record("reduce_scatter", core::kNoIndex, "comm", flight, 105, 120);
  tracer.record("all_gather", core::kNoIndex, "comm", flight, 112, 130);
  tracer.record("forward_backward", core::kNoIndex, "device", device, 100, 150);
  tracer.record("quote\"name", 7, "phase", 0, 90, 160);
  const core::JsonValue events = events_of(tracer, 1);
  std::map<std::string, const core::JsonValue*> by_name;
  std::map<int64_t, std::string> thread_names;
  for (const core::JsonValue& e : events.items()) {
    const std::string ph = e.find("ph")->as_string("ph");
    EXPECT_EQ(e.find("pid")->as_int64("pid"), 1);
    if (ph == "X") by_name[e.find("name")->as_string("name")] = &e;
    if (ph == "M" && e.find("name")->as_string("name") == "thread_name")
      thread_names[e.find("tid")->as_int64("tid")] =
          e.find("args")->find("name")->as_string("name");
  }
  ASSERT_EQ(by_name.size(), 5u);
  auto tid = [&](const char* name) { return by_name.at(name)->find("tid")->as_int64("tid"); };
  EXPECT_EQ(tid("all_reduce"), tid("all_gather"));
  EXPECT_NE(tid("all_reduce"), tid("reduce_scatter"));
  EXPECT_EQ(thread_names.at(tid("all_reduce")), "main in flight 0");
  EXPECT_EQ(thread_names.at(tid("reduce_scatter")), "main in flight 1");
  EXPECT_EQ(thread_names.at(tid("forward_backward")), "device");
  EXPECT_EQ(thread_names.at(tid("quote\"name 7")), "main");
  EXPECT_DOUBLE_EQ(by_name.at("reduce_scatter")->find("ts")->as_double("ts"), 105.0);
  EXPECT_DOUBLE_EQ(by_name.at("reduce_scatter")->find("dur")->as_double("dur"), 15.0);
  EXPECT_EQ(by_name.at("all_gather")->find("cat")->as_string("cat"), "comm");
}

TEST(Tracer, ClearedSpansLeaveTheTracks) {
  core::Tracer tracer;
  tracer.set_active(true);
  { core::TraceScope span(&tracer, "phase", "x"); }
  tracer.clear_spans();
  EXPECT_TRUE(tracer.spans().empty());
  EXPECT_EQ(tracer.tracks().size(), 1u);
  // Process metadata only.
  EXPECT_EQ(events_of(tracer, 0).items().size(), 2u);
}

}  // namespace
