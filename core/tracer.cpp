#include "core/tracer.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>

namespace core {

Tracer::Tracer(std::string main_thread) {
  tracks_.push_back({std::move(main_thread), false});
  thread_tracks_.emplace_back(std::this_thread::get_id(), 0);
}

double Tracer::now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int Tracer::thread_track_locked() {
  const std::thread::id me = std::this_thread::get_id();
  for (const auto& [id, track] : thread_tracks_)
    if (id == me) return track;
  const int track = static_cast<int>(tracks_.size());
  tracks_.push_back({"thread " + std::to_string(thread_tracks_.size()), false});
  thread_tracks_.emplace_back(me, track);
  return track;
}

int Tracer::thread_track() {
  std::lock_guard<std::mutex> lock(mutex_);
  return thread_track_locked();
}

void Tracer::name_thread(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  tracks_[thread_track_locked()].name = name;
}

int Tracer::named_track(const std::string& name, bool overlapping) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (size_t t = 0; t < tracks_.size(); ++t)
    if (tracks_[t].name == name && tracks_[t].overlapping == overlapping)
      return static_cast<int>(t);
  tracks_.push_back({name, overlapping});
  return static_cast<int>(tracks_.size()) - 1;
}

int Tracer::in_flight_track() {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    name = tracks_[thread_track_locked()].name + " in flight";
  }
  return named_track(name, true);
}

void Tracer::record(std::string_view name, int index, const char* category, int track,
                    double begin_us, double end_us) {
  std::string text(name);
  if (index != kNoIndex) {
    text += ' ';
    text += std::to_string(index);
  }
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.push_back({std::move(text), category, track, begin_us, end_us});
}

std::vector<TraceSpan> Tracer::spans() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return spans_;
}

std::vector<TraceTrack> Tracer::tracks() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return tracks_;
}

void Tracer::clear_spans() {
  std::lock_guard<std::mutex> lock(mutex_);
  spans_.clear();
}

namespace {

std::string json_string(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out += c;
    }
  }
  return out + '"';
}

// Microseconds with nanosecond resolution (Chrome's ts and dur are in microseconds).
std::string us(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

// Lanes of one thread id each: a track's tid is track * kLanes + lane.
constexpr int kLanes = 1000;

}  // namespace

std::string chrome_trace_events(const Tracer& tracer, int pid, const std::string& process_name,
                                double shift_us) {
  std::vector<TraceSpan> spans = tracer.spans();
  const std::vector<TraceTrack> tracks = tracer.tracks();
  // Spans by begin (the longer first on a tie: a parent before the children it starts with),
  // then the lanes of overlapping tracks: the first lane free at a span's begin.
  std::stable_sort(spans.begin(), spans.end(), [](const TraceSpan& a, const TraceSpan& b) {
    return a.begin_us != b.begin_us ? a.begin_us < b.begin_us : a.end_us > b.end_us;
  });
  std::map<int, std::vector<double>> lane_ends;  // overlapping track -> each lane's last end
  std::map<int, int> lanes_used;                 // tid -> track
  const std::string p = std::to_string(pid);
  std::string out;
  auto add = [&out](const std::string& event) {
    if (!out.empty()) out += ",\n";
    out += event;
  };
  std::string events;
  for (const TraceSpan& s : spans) {
    int lane = 0;
    if (tracks[s.track].overlapping) {
      std::vector<double>& ends = lane_ends[s.track];
      while (lane < static_cast<int>(ends.size()) && ends[lane] > s.begin_us)
        ++lane;
      if (lane == static_cast<int>(ends.size())) ends.push_back(0);
      ends[lane] = s.end_us;
    }
    const int tid = s.track * kLanes + std::min(lane, kLanes - 1);
    lanes_used[tid] = s.track;
    if (!events.empty()) events += ",\n";
    events += "{\"name\":" + json_string(s.name) + ",\"cat\":\"" + s.category +
              "\",\"ph\":\"X\",\"pid\":" + p + ",\"tid\":" + std::to_string(tid) +
              ",\"ts\":" + us(s.begin_us + shift_us) +
              ",\"dur\":" + us(std::max(0.0, s.end_us - s.begin_us)) + "}";
  }
  add("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p +
      ",\"args\":{\"name\":" + json_string(process_name) + "}}");
  add("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + p +
      ",\"args\":{\"sort_index\":" + p + "}}");
  for (const auto& [tid, track] : lanes_used) {
    std::string name = tracks[track].name;
    if (tracks[track].overlapping) {
      name += ' ';
      name += std::to_string(tid % kLanes);
    }
    add("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" + std::to_string(tid) +
        ",\"args\":{\"name\":" + json_string(name) + "}}");
    add("{\"name\":\"thread_sort_index\",\"ph\":\"M\",\"pid\":" + p + ",\"tid\":" +
        std::to_string(tid) + ",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}");
  }
  if (!events.empty()) add(events);
  return out;
}

}  // namespace core
