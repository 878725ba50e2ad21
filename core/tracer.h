// Tracer: spans (a name, a category, a track, begin and end times) recorded while a run is
// traced, for a timeline of where a step's time goes (engine/run_trace.h writes a run's spans as
// Chrome trace-event JSON). A track is a row of the timeline: each thread that records is one
// (named once, e.g. "main", "comm thread"), and a track may also stand for what no thread does
// while it happens: a collective in flight behind computation, the device's work.
//
// Times are microseconds of the steady clock (Tracer::now_us). Recording is thread-safe; it
// allocates (a span's name), so callers record only while active(): with no tracer (a null
// pointer) or an inactive one a TraceScope is one branch and no allocation.
#pragma once

#include <atomic>
#include <limits>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

namespace core {

// A span's name without an index (" <index>" is appended to a name given any other index).
inline constexpr int kNoIndex = std::numeric_limits<int>::min();

struct TraceSpan {
  std::string name;
  const char* category;  // a string literal: "step", "phase", "layer", "comm", "wait", ...
  int track;
  double begin_us;
  double end_us;
};

struct TraceTrack {
  std::string name;
  // Spans of this track may overlap without nesting (collectives in flight at once): the writer
  // spreads them over lanes so that each lane's spans are disjoint.
  bool overlapping = false;
};

class Tracer {
 public:
  // The constructing thread's track is 0, named `main_thread`.
  explicit Tracer(std::string main_thread = "main");

  static double now_us();

  void set_active(bool on) { active_.store(on, std::memory_order_relaxed); }
  bool active() const { return active_.load(std::memory_order_relaxed); }

  // The calling thread's track; a thread seen for the first time gets one named "thread N".
  int thread_track();
  // Names the calling thread's track.
  void name_thread(const std::string& name);
  // A track of its own (the device), or the track "<name>" shared by every caller asking for the
  // same name and `overlapping`.
  int named_track(const std::string& name, bool overlapping = false);
  // The calling thread's in-flight track: "<thread's name> in flight", overlapping.
  int in_flight_track();

  // Records `name` (with " <index>" appended unless index is kNoIndex) on `track`.
  void record(std::string_view name, int index, const char* category, int track, double begin_us,
              double end_us);

  std::vector<TraceSpan> spans() const;
  std::vector<TraceTrack> tracks() const;
  void clear_spans();

 private:
  int thread_track_locked();

  std::atomic<bool> active_{false};
  mutable std::mutex mutex_;
  std::vector<TraceTrack> tracks_;
  std::vector<std::pair<std::thread::id, int>> thread_tracks_;
  std::vector<TraceSpan> spans_;
};

// A span of the calling thread from construction to destruction, recorded when `tracer` is
// non-null and active at construction.
class TraceScope {
 public:
  // `name` must outlive the scope.
  TraceScope(Tracer* tracer, const char* category, std::string_view name, int index = kNoIndex)
      : tracer_(tracer != nullptr && tracer->active() ? tracer : nullptr) {
    if (tracer_ == nullptr) return;
    category_ = category;
    name_ = name;
    index_ = index;
    begin_us_ = Tracer::now_us();
  }
  ~TraceScope() {
    if (tracer_ != nullptr)
      tracer_->record(name_, index_, category_, tracer_->thread_track(), begin_us_,
                      Tracer::now_us());
  }
  TraceScope(const TraceScope&) = delete;
  TraceScope& operator=(const TraceScope&) = delete;

 private:
  Tracer* tracer_;
  const char* category_ = nullptr;
  std::string_view name_;
  int index_ = kNoIndex;
  double begin_us_ = 0;
};

// Chrome trace-event JSON of the tracer's spans as process `pid` named `process_name`: the
// events, comma-separated, without the enclosing array (a run's ranks are concatenated). Times
// are shifted by `shift_us` (to a clock common to the processes and an origin near zero).
// Overlapping tracks are spread over lanes "<name> k".
std::string chrome_trace_events(const Tracer& tracer, int pid, const std::string& process_name,
                                double shift_us);

}  // namespace core
