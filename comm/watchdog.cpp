#include "comm/watchdog.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <vector>

#include "comm/abort.h"

namespace comm {

namespace {

constexpr int kQueryTag = 7001;
constexpr int kAnswerTag = 7002;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

std::string seconds_text(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.1f s", s);
  return buf;
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks)
    s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

}  // namespace

Watchdog::Watchdog(double timeout_s, double grace_s) : timeout_s_(timeout_s), grace_s_(grace_s) {
  since_ns_ = now_ns();
  int provided = 0;
  MPI_Query_thread(&provided);
  if (timeout_s_ <= 0 || provided < MPI_THREAD_MULTIPLE) return;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  if (size_ > 1) thread_ = std::thread([this] { loop(); });
}

Watchdog::~Watchdog() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void Watchdog::enter(const char* what) {
  what_ = what;
  suspended_ns_ = 0;
  since_ns_ = now_ns();
  seq_.fetch_add(1);
  inside_ = true;
}

void Watchdog::leave() {
  inside_ = false;
  suspended_ns_ = 0;
  since_ns_ = now_ns();
}

Watchdog::Status Watchdog::status() const {
  Status s;
  s.inside = inside_ ? 1 : 0;
  s.seq = seq_;
  s.elapsed_ms = std::max<int64_t>(0, now_ns() - since_ns_ - suspended_ns_) / 1000000;
  return s;
}

void Watchdog::serve_queries() {
  for (;;) {
    int flag = 0;
    MPI_Status st;
    MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, comm_, &flag, &st);
    if (!flag) return;
    int64_t their_seq = 0;
    MPI_Recv(&their_seq, 1, MPI_INT64_T, st.MPI_SOURCE, kQueryTag, comm_, MPI_STATUS_IGNORE);
    const Status s = status();
    const int64_t answer[3] = {s.seq, s.inside, s.elapsed_ms};
    // Small enough to go eagerly: returns without the asker's help.
    MPI_Send(answer, 3, MPI_INT64_T, st.MPI_SOURCE, kAnswerTag, comm_);
  }
}

void Watchdog::loop() {
  const auto poll = std::chrono::milliseconds(50);
  // A look that comes this much later than the poll asks: the process was suspended meanwhile
  // (a loaded machine delays a look by milliseconds, not seconds).
  constexpr int64_t kSuspendedNs = 2'000'000'000;
  int64_t last_look_ns = now_ns();
  while (!stop_) {
    const int64_t look_ns = now_ns();
    const int64_t late_ns = look_ns - last_look_ns - poll.count() * 1'000'000;
    if (late_ns > kSuspendedNs) suspended_ns_ += late_ns;
    last_look_ns = look_ns;
    serve_queries();
    const Status s = status();
    if (s.inside && static_cast<double>(s.elapsed_ms) / 1000.0 > timeout_s_ &&
        now_ns() >= deferred_until_ns_)
      report_or_defer(s);
    std::this_thread::sleep_for(poll);
  }
}

void Watchdog::report_or_defer(const Status& mine) {
  // Ask every other rank where it is; keep answering their questions while waiting.
  std::vector<std::array<int64_t, 3>> answers(static_cast<size_t>(size_));
  std::vector<MPI_Request> recvs(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  std::vector<MPI_Request> sends(static_cast<size_t>(size_), MPI_REQUEST_NULL);
  std::vector<bool> answered(static_cast<size_t>(size_), false);
  const int64_t seq = mine.seq;
  query_seq_ = seq;  // the send buffer outlives this call should it return (deferring)
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    MPI_Irecv(answers[r].data(), 3, MPI_INT64_T, r, kAnswerTag, comm_, &recvs[r]);
    MPI_Isend(&query_seq_, 1, MPI_INT64_T, r, kQueryTag, comm_, &sends[r]);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s_);
  int pending = size_ - 1;
  while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
    serve_queries();
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ || answered[r]) continue;
      int flag = 0;
      MPI_Test(&recvs[r], &flag, MPI_STATUS_IGNORE);
      if (flag) answered[r] = true, --pending;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // One rank reports: the lowest one waiting inside a collective (ranks may wait in different
  // ones: a rank behind waits in an earlier one). A higher one leaves it to that rank, whose own
  // timeout may come a little later, and reports itself only if the job is still alive well
  // after that.
  for (int r = 0; r < rank_; ++r) {
    const auto& a = answers[r];
    if (!answered[r] || a[1] != 1) continue;
    const double its_wait_s = std::max(0.0, timeout_s_ - static_cast<double>(a[2]) / 1000.0);
    deferred_until_ns_ = now_ns() + static_cast<int64_t>((its_wait_s + 2 * grace_s_ + 1.0) * 1e9);
    for (int q = 0; q < size_; ++q) {  // the questions and answers still in flight
      if (q == rank_) continue;
      if (!answered[q]) {
        MPI_Cancel(&recvs[q]);
        MPI_Wait(&recvs[q], MPI_STATUS_IGNORE);
      }
      if (sends[q] != MPI_REQUEST_NULL) MPI_Request_free(&sends[q]);
    }
    return;
  }
  std::vector<int> silent, behind, waiting = {rank_};
  std::string details;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    if (!answered[r]) {
      silent.push_back(r);
      continue;
    }
    const auto& a = answers[r];
    if (a[0] < seq) {  // still before collective #seq
      behind.push_back(r);
      details += "; rank " + std::to_string(r) + " is " +
                 (a[1] ? "inside collective #" + std::to_string(a[0]) + " for "
                       : "computing after collective #" + std::to_string(a[0]) + " for ") +
                 seconds_text(static_cast<double>(a[2]) / 1000.0);
    } else {
      waiting.push_back(r);
    }
  }
  std::vector<int> missing = silent;
  missing.insert(missing.end(), behind.begin(), behind.end());
  std::string message = "comm watchdog: collective #" + std::to_string(seq) + " (" + what_.load() +
                        ") has waited " +
                        seconds_text(static_cast<double>(mine.elapsed_ms) / 1000.0) +
                        " (comm.timeout_s = " + seconds_text(timeout_s_) + ") for rank(s) " +
                        (missing.empty() ? std::string("(none identified)") : rank_list(missing)) +
                        " that did not arrive";
  if (!silent.empty())
    message += "; rank(s) " + rank_list(silent) + " did not answer within " +
               seconds_text(grace_s_) + " (stopped, dead or hung)";
  message += details;
  message += "; waiting in it: rank(s) " + rank_list(waiting) + ". Aborting the job.";
  abort_job(message);
}

}  // namespace comm
