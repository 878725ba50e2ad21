// The model's outputs bit for bit against the values the build before a refactor recorded
// (tests/model/golden/outputs_np<N>.txt): for every config in configs/ and the model tests' recipe
// configs, in fp32 and bf16, at the world size ctest runs it with. Each rank runs its rows of one
// seeded batch (the trainer's split), the gradients are summed over the ranks, and a line holds
// the loss, the cross-entropy and the evaluation loss of each rank (C99 hex floats), the sum of
// squares of the summed gradient (hex), a hash of its bytes and a hash of each rank's sampling
// logits. A refactor that moves code without changing what it computes leaves every line as it
// was.
//
// The bits depend on the machine's kernels (the CPU's instruction set, oneDNN's and OpenBLAS's
// kernels) and on the threads of a GEMM: the file names the CPU it was recorded on
// (core::cpu::describe_cpu()), each rank runs on one thread, and on another CPU the test skips,
// saying so. Record afresh, before a refactor and on the machine that checks it:
//   ENGINE_WRITE_MODEL_GOLDEN=1 ctest -R model_golden_outputs
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "core/cpu/cpu_isa.h"
#include "core/rng.h"
#include "engine/config.h"
#include "engine/model_loading.h"
#include "model/gpt.h"
#include "tests/model/recipe_config.h"
#include "tests/omp_threads.h"

namespace {

struct Case {
  std::string name;
  std::function<model::ModelConfig()> config;
  int B = 4;  // rows of the batch (split over the ranks)
  // The long attention window the trainer's schedule would set (0: the config's).
  int window = 0;
};

// A config file's model section; the sizes that cost time shrunk where noted (every switch kept).
model::ModelConfig from_file(const std::string& file, const std::vector<std::string>& sets) {
  return engine::model_config_of(engine::load_config(
      std::string(ENGINE_SOURCE_DIR) + "/configs/" + file, sets, engine::ConfigUse::ModelOnly));
}

model::ModelConfig tiny_modern() {
  model::ModelConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 32;
  c.seq_len = 16;
  c.vocab_size = 100;
  return c;
}

std::vector<Case> cases() {
  std::vector<Case> out;
  // The configs whose sizes run in a second as they are, at 64 tokens a row.
  for (const char* file :
       {"cpu_small.yaml", "osft_finetune.yaml", "osft_finetune_baseline.yaml", "osft_tiny.yaml",
        "soap.yaml", "speedrun_cpu.yaml", "speedrun_cpu_recipe.yaml", "stacked_soap_moe.yaml",
        "tiny.yaml", "torch_compare_adamw.yaml", "torch_compare_recipe.yaml"}) {
    out.push_back({file, [file] { return from_file(file, {"model.seq_len=32"}); }});
  }
  // GPT-2 124M at D 384 (12 heads of 32), 64 tokens a row.
  out.push_back({"gpt2_124m.yaml", [] {
                   return from_file("gpt2_124m.yaml", {"model.seq_len=64", "model.d_model=384"});
                 }});
  // Record #24 at D 192 (6 heads of 32), rows of 384 tokens = 3 window blocks, the long window 2
  // blocks and the short one 1: every mask bites.
  out.push_back(
      {"speedrun_gpu.yaml",
       [] {
         return from_file("speedrun_gpu.yaml", {"model.seq_len=384", "model.d_model=192"});
       },
       2, 256});
  // The model tests' configs: every recipe key, and the record's exact forms with the FP8 head.
  out.push_back({"test:recipe", [] {
                   model::ModelConfig c = test_model::with_recipe_keys(tiny_modern(), 30.0f, 1);
                   c.n_head = 2;
                   return c;
                 }});
  out.push_back({"test:record_exact_fp8", [] {
                   model::ModelConfig c = test_model::with_recipe_keys(tiny_modern(), 30.0f, 1);
                   return test_model::with_record_exact(c, 2, 3, true);
                 }});
  out.push_back({"test:gpt2_tiny", [] {
                   model::ModelConfig c = tiny_modern();
                   c.arch = model::Arch::Gpt2;
                   return c;
                 }});
  out.push_back({"test:moe_softcap", [] {
                   model::ModelConfig c = tiny_modern();
                   c.moe_experts = 4;
                   c.softcap = 15.0f;
                   return c;
                 }});
  return out;
}

std::string hex(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%a", v);
  return buf;
}

std::string hex64(uint64_t v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// FNV-1a over bytes.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

// Each rank's value, in rank order, joined by commas (collective).
std::string per_rank(comm::Communicator& comm, double v) {
  std::vector<double> all(static_cast<size_t>(comm.size()), 0.0);
  all[static_cast<size_t>(comm.rank())] = v;
  comm.all_reduce(all.data(), static_cast<int64_t>(all.size()), comm::ReduceOp::Sum);
  std::string s;
  for (double x : all) {
    if (!s.empty()) s += ',';
    s += hex(x);
  }
  return s;
}

std::string per_rank_hash(comm::Communicator& comm, uint64_t v) {
  std::vector<int64_t> all(static_cast<size_t>(comm.size()), 0);
  all[static_cast<size_t>(comm.rank())] = static_cast<int64_t>(v);
  comm.all_reduce(all.data(), static_cast<int64_t>(all.size()), comm::ReduceOp::Sum);
  std::string s;
  for (int64_t x : all) {
    if (!s.empty()) s += ',';
    s += hex64(static_cast<uint64_t>(x));
  }
  return s;
}

// The line of one case in one precision (collective).
std::string run_case(const Case& k, model::Precision precision, comm::Communicator& comm) {
  model::ModelConfig c = k.config();
  c.precision = precision;
  const int T = c.seq_len, B = k.B, np = comm.size();
  EXPECT_EQ(B % np, 0) << k.name;
  // The batch: seeded tokens, a document start (doc_bos) every 23 tokens where the config has one.
  core::Rng rng(core::rng_hash(2026, fnv1a(k.name.data(), k.name.size())));
  std::vector<int32_t> x(size_t(B) * T), y(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = static_cast<int32_t>(rng.next_below(c.vocab_size));
    y[i] = static_cast<int32_t>(rng.next_below(c.vocab_size));
    if (c.doc_bos >= 0 && i % 23 == 5) x[i] = c.doc_bos;
  }
  const int rows = B / np;
  const int32_t* xr = x.data() + size_t(comm.rank()) * rows * T;
  const int32_t* yr = y.data() + size_t(comm.rank()) * rows * T;

  model::Gpt gpt(c, core::cpu_backend());
  gpt.init_weights();
  if (k.window > 0) gpt.set_attention_window(k.window);
  // A zero-initialised projection or head would hide most of the backward: every parameter
  // drawn (seeded per parameter, the same on every rank), then the model told.
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    core::Tensor p = gpt.param(i);
    const model::ParamInfo& info = gpt.table()[i];
    const double scale = info.shape.size() > 1 ? 0.5 / std::sqrt(double(info.shape.back())) : 0.3;
    const double mean = info.shape.size() > 1 ? 0.0 : 0.7;
    float* d = p.data<float>();
    const int64_t valid =
        info.valid_rows >= 0 ? info.valid_rows * (info.numel / info.shape[0]) : info.numel;
    for (int64_t e = 0; e < valid; ++e)
      d[e] = static_cast<float>(mean + scale * core::rng_normal(core::rng_hash(99, i), e));
  }
  gpt.params_updated();
  gpt.zero_grad();
  const float loss = gpt.forward(xr, yr, rows, T);
  const float ce = gpt.ce_loss();
  gpt.backward();
  std::vector<float> g = gpt.grads().to_vector();
  comm.all_reduce(g.data(), static_cast<int64_t>(g.size()), comm::ReduceOp::Sum);
  double sq = 0.0;
  for (float v : g)
    sq += double(v) * v;
  const float eval = gpt.eval_loss(xr, yr, rows, T);
  const std::vector<float> logits = gpt.last_logits(xr, rows, T);

  std::ostringstream line;
  line << k.name << ' ' << model::precision_name(precision) << " loss " << per_rank(comm, loss)
       << " ce " << per_rank(comm, ce) << " eval " << per_rank(comm, eval) << " grad_sq " << hex(sq)
       << " grad_hash " << hex64(fnv1a(g.data(), g.size() * sizeof(float))) << " logits_hash "
       << per_rank_hash(comm, fnv1a(logits.data(), logits.size() * sizeof(float)));
  return line.str();
}

std::string golden_path(int np) {
  return std::string(ENGINE_SOURCE_DIR) + "/tests/model/golden/outputs_np" + std::to_string(np) +
         ".txt";
}

const std::string kMachine = "# machine: ";

TEST(ModelGolden, EveryConfigComputesWhatTheRecordedBuildComputed) {
  std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
  test_util::OmpThreads one_thread(1);
  const std::string path = golden_path(world->size());
  const bool write = std::getenv("ENGINE_WRITE_MODEL_GOLDEN") != nullptr;
  std::map<std::string, std::string> want;
  if (!write) {
    std::ifstream in(path);
    ASSERT_TRUE(in) << path << ": no recorded outputs (ENGINE_WRITE_MODEL_GOLDEN=1 records them)";
    std::string line, machine;
    while (std::getline(in, line)) {
      if (line.rfind(kMachine, 0) == 0) machine = line.substr(kMachine.size());
      if (line.empty() || line[0] == '#') continue;
      const size_t a = line.find(' '), b = line.find(' ', a + 1);
      want[line.substr(0, b)] = line;
    }
    if (machine != core::cpu::describe_cpu())
      GTEST_SKIP() << path << " was recorded on '" << machine << "', this is '"
                   << core::cpu::describe_cpu() << "': the bits differ between kernels";
  }
  std::vector<std::string> lines;
  for (const Case& k : cases()) {
    for (model::Precision p : {model::Precision::Fp32, model::Precision::Bf16}) {
      const std::string got = run_case(k, p, *world);
      lines.push_back(got);
      if (write) continue;
      const std::string key = k.name + ' ' + model::precision_name(p);
      ASSERT_TRUE(want.count(key)) << path << " has no line for " << key;
      EXPECT_EQ(got, want[key]) << key << " computes other values than the recorded build";
    }
  }
  if (write && world->rank() == 0) {
    std::ofstream out(path);
    out << "# The model's outputs at np " << world->size()
        << " (tests/model/golden_outputs_test.cpp writes and checks them).\n"
        << kMachine << core::cpu::describe_cpu() << "\n";
    for (const std::string& l : lines)
      out << l << "\n";
    std::printf("wrote %s (%zu lines)\n", path.c_str(), lines.size());
  }
}

}  // namespace
