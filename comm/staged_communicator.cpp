#include "comm/staged_communicator.h"

#include <vector>

#include "core/check.h"
#include "core/transfer.h"

namespace comm {

namespace {

// An async collective in flight on host copies: the host Work, the host buffer it writes and
// where its result goes on the device.
class StagedWork final : public Work {
 public:
  StagedWork(core::Backend& backend, std::vector<float> host, float* device_out)
      : backend_(backend), host_(std::move(host)), device_out_(device_out) {}
  ~StagedWork() override {
    if (!done_) wait();
  }
  std::vector<float>& host() { return host_; }
  void start(std::unique_ptr<Work> work) { work_ = std::move(work); }

  void wait() override {
    if (done_) return;
    work_->wait();
    finish();
  }
  bool test() override {
    if (!done_ && work_->test()) finish();
    return done_;
  }

 private:
  void finish() {
    if (!host_.empty())
      backend_.copy_from_host(device_out_, host_.data(), host_.size() * sizeof(float));
    done_ = true;
  }

  core::Backend& backend_;
  std::vector<float> host_;
  float* device_out_;
  std::unique_ptr<Work> work_;
  bool done_ = false;
};

class StagedCommunicator final : public Communicator {
 public:
  StagedCommunicator(Communicator& host, core::Backend& backend,
                     std::unique_ptr<Communicator> owned = nullptr)
      : Communicator(host.rank(), host.size()),
        host_(host),
        backend_(backend),
        owned_(std::move(owned)) {
    ENGINE_CHECK(core::is_host_memory(host.device()),
                 "staged communicator: the host communicator " + host.name() +
                     " moves buffers on " + host.device().str() + ", not on the host");
  }

  core::Device device() const override { return backend_.device(); }
  std::string name() const override {
    return "mpi-staged " + std::to_string(rank()) + "/" + std::to_string(size()) + " on " +
           backend_.device().str();
  }

  std::unique_ptr<Work> all_reduce_async(float* buf, int64_t count, ReduceOp op) override {
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(float)));
    auto work = std::make_unique<StagedWork>(backend_, download(buf, count), buf);
    work->start(host_.all_reduce_async(data(work->host()), count, op));
    return work;
  }
  void all_reduce(float* buf, int64_t count, ReduceOp op) override {
    ScopedWait timer(stats_);
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(float)));
    std::vector<float> host = download(buf, count);
    host_.all_reduce(data(host), count, op);
    upload(buf, host);
  }
  void all_reduce(double* buf, int64_t count, ReduceOp op) override {
    host_.all_reduce(buf, count, op);
  }
  void all_reduce(int64_t* buf, int64_t count, ReduceOp op) override {
    host_.all_reduce(buf, count, op);
  }
  void all_reduce_on_device(double* buf, int64_t count, ReduceOp op) override {
    ScopedWait timer(stats_);
    stats_.record(Collective::AllReduce, count * static_cast<int64_t>(sizeof(double)));
    std::vector<double> host(static_cast<size_t>(count));
    const size_t bytes = host.size() * sizeof(double);
    backend_.copy_to_host(host.data(), buf, bytes);
    host_.all_reduce(host.data(), count, op);
    backend_.copy_from_host(buf, host.data(), bytes);
  }

  std::unique_ptr<Work> reduce_scatter_async(const float* send, float* recv,
                                             std::span<const int64_t> counts,
                                             ReduceOp op) override {
    const int64_t n = check_counts("reduce_scatter", counts);
    stats_.record(Collective::ReduceScatter, n * static_cast<int64_t>(sizeof(float)));
    const std::vector<float> in = download(send, n);
    auto work = std::make_unique<StagedWork>(
        backend_, std::vector<float>(static_cast<size_t>(counts[rank()])), recv);
    // The host send buffer must outlive the collective: it rides in a second Work.
    auto keep = std::make_shared<std::vector<float>>(in);
    work->start(std::make_unique<KeepAlive>(
        host_.reduce_scatter_async(keep->data(), data(work->host()), counts, op), keep));
    return work;
  }
  void reduce_scatter(const float* send, float* recv, std::span<const int64_t> counts,
                      ReduceOp op) override {
    ScopedWait timer(stats_);
    const int64_t n = check_counts("reduce_scatter", counts);
    stats_.record(Collective::ReduceScatter, n * static_cast<int64_t>(sizeof(float)));
    const std::vector<float> in = download(send, n);
    std::vector<float> out(static_cast<size_t>(counts[rank()]));
    host_.reduce_scatter(data(in), data(out), counts, op);
    upload(recv, out);
  }

  std::unique_ptr<Work> all_gather_async(const float* send, float* recv,
                                         std::span<const int64_t> counts) override {
    const int64_t n = check_counts("all_gather", counts);
    stats_.record(Collective::AllGather, counts[rank()] * static_cast<int64_t>(sizeof(float)));
    auto keep = std::make_shared<std::vector<float>>(download(send, counts[rank()]));
    auto work =
        std::make_unique<StagedWork>(backend_, std::vector<float>(static_cast<size_t>(n)), recv);
    work->start(std::make_unique<KeepAlive>(
        host_.all_gather_async(keep->data(), data(work->host()), counts), keep));
    return work;
  }
  void all_gather(const float* send, float* recv, std::span<const int64_t> counts) override {
    ScopedWait timer(stats_);
    const int64_t n = check_counts("all_gather", counts);
    stats_.record(Collective::AllGather, counts[rank()] * static_cast<int64_t>(sizeof(float)));
    const std::vector<float> in = download(send, counts[rank()]);
    std::vector<float> out(static_cast<size_t>(n));
    host_.all_gather(data(in), data(out), counts);
    upload(recv, out);
  }

  std::unique_ptr<Work> broadcast_async(float* buf, int64_t count, int root) override {
    check_root("broadcast", root);
    stats_.record(Collective::Broadcast,
                  rank() == root ? count * static_cast<int64_t>(sizeof(float)) : 0);
    auto work = std::make_unique<StagedWork>(
        backend_, rank() == root ? download(buf, count) : std::vector<float>(count), buf);
    work->start(host_.broadcast_async(data(work->host()), count, root));
    return work;
  }
  void broadcast(double* buf, int64_t count, int root) override {
    host_.broadcast(buf, count, root);
  }
  void broadcast_bytes(void* buf, int64_t bytes, int root) override {
    host_.broadcast_bytes(buf, bytes, root);
  }
  void barrier() override { host_.barrier(); }

  std::unique_ptr<Communicator> split(int color, int key) override {
    std::unique_ptr<Communicator> host = host_.split(color, key);
    Communicator& ref = *host;
    return std::make_unique<StagedCommunicator>(ref, backend_, std::move(host));
  }
  void copy_local(void* dst, const void* src, size_t bytes) override {
    if (bytes > 0) backend_.copy(dst, src, bytes);
  }

 private:
  // Holds a host buffer alive until the wrapped Work has completed.
  class KeepAlive final : public Work {
   public:
    KeepAlive(std::unique_ptr<Work> work, std::shared_ptr<std::vector<float>> buffer)
        : work_(std::move(work)), buffer_(std::move(buffer)) {}
    void wait() override { work_->wait(); }
    bool test() override { return work_->test(); }

   private:
    std::unique_ptr<Work> work_;  // destroyed (and so waited for) before buffer_
    std::shared_ptr<std::vector<float>> buffer_;
  };

  static float* data(std::vector<float>& v) { return v.empty() ? &empty_ : v.data(); }
  static const float* data(const std::vector<float>& v) { return v.empty() ? &empty_ : v.data(); }
  std::vector<float> download(const float* device, int64_t count) const {
    std::vector<float> host(static_cast<size_t>(count));
    if (count > 0) backend_.copy_to_host(host.data(), device, host.size() * sizeof(float));
    return host;
  }
  void upload(float* device, const std::vector<float>& host) const {
    if (!host.empty()) backend_.copy_from_host(device, host.data(), host.size() * sizeof(float));
  }

  inline static float empty_ = 0;  // a valid pointer for empty buffers (MPI wants one)
  Communicator& host_;
  core::Backend& backend_;
  std::unique_ptr<Communicator> owned_;  // a split's host communicator
};

}  // namespace

std::unique_ptr<Communicator> make_staged(Communicator& host, core::Backend& backend) {
  return std::make_unique<StagedCommunicator>(host, backend);
}

}  // namespace comm
