// engine: the MPI-launched training executable and its subcommands.
//
//   mpirun -np N engine [train] --config C.yaml [--set key=value ...]
//   mpirun -np N engine eval    (--config C.yaml | --checkpoint DIR) [--set ...]
//   engine export  (--config C.yaml | --checkpoint DIR) --out model.safetensors
//   engine sample  (--config C.yaml | --checkpoint DIR) [--prompt TEXT] [--tokens N]
//                  [--temperature X] [--top_k K] [--seed S] [--tokenizer DIR]
//   engine config-reference            the config keys as a Markdown table
//   engine --print-config --config C   the effective config, then exit
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "comm/watchdog.h"
#include "comm/watched_communicator.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/core/check.h"
#include "engine/core/rng.h"
#include "engine/data/gpt2_tokenizer.h"
#include "engine/preflight.h"
#include "engine/run_lock.h"
#include "engine/stop_signal.h"
#include "engine/trainer.h"
#include "model/weights_io.h"

namespace {

void print_usage() {
  std::printf(
      "usage: mpirun -np N engine [train] --config C.yaml [--set key=value ...]\n"
      "       mpirun -np N engine eval (--config C.yaml | --checkpoint DIR) [--set ...]\n"
      "       engine export (--config C.yaml | --checkpoint DIR) --out FILE.safetensors\n"
      "       engine sample (--config C.yaml | --checkpoint DIR) [--prompt TEXT] [--tokens N]\n"
      "                     [--temperature X] [--top_k K] [--seed S] [--tokenizer DIR]\n"
      "       engine config-reference\n"
      "       engine --print-config --config C.yaml [--set ...]\n"
      "\n"
      "Trains a GPT with ZeRO-sharded state (see README.md and `engine config-reference`).\n"
      "With --config, eval/export/sample use checkpoint.resume (default: the newest checkpoint\n"
      "in checkpoint.dir); --checkpoint DIR takes the config saved in that checkpoint.\n");
}

struct Args {
  std::string command = "train";
  std::string config;
  std::string checkpoint;
  std::vector<std::string> sets;
  std::map<std::string, std::string> options;  // --out, --prompt, --tokens, ...
  bool print_config = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  int i = 1;
  const std::vector<std::string> commands = {"train", "eval", "export", "sample",
                                             "config-reference"};
  if (i < argc && std::find(commands.begin(), commands.end(), argv[i]) != commands.end())
    a.command = argv[i++];
  const std::vector<std::string> valued = {"--out",   "--prompt", "--tokens",   "--temperature",
                                           "--top_k", "--seed",   "--tokenizer"};
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      ENGINE_CHECK(i + 1 < argc, "option " + arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--config") {
      a.config = value();
    } else if (arg == "--checkpoint") {
      a.checkpoint = value();
    } else if (arg == "--set") {
      a.sets.push_back(value());
    } else if (arg.rfind("--set=", 0) == 0) {
      a.sets.push_back(arg.substr(6));
    } else if (arg == "--print-config") {
      a.print_config = true;
    } else if (std::find(valued.begin(), valued.end(), arg) != valued.end()) {
      a.options[arg] = value();
    } else {
      ENGINE_FAIL("unknown argument '" + arg + "' (engine --help lists the options)");
    }
  }
  return a;
}

// The config of a subcommand and the checkpoint it reads ("" for train).
engine::Config command_config(const Args& a, std::string& checkpoint) {
  if (!a.checkpoint.empty()) {
    engine::verify_checkpoint(a.checkpoint);
    engine::Manifest m = engine::read_manifest(a.checkpoint);
    checkpoint = a.checkpoint;
    std::vector<std::string> sets = a.sets;
    sets.insert(sets.begin(), "checkpoint.resume=");
    return engine::parse_config(m.config_yaml, a.checkpoint + "/manifest.yaml", sets);
  }
  ENGINE_CHECK(!a.config.empty(),
               "engine " + a.command + " needs --config FILE or --checkpoint DIR");
  engine::Config c = engine::load_config(a.config, a.sets);
  if (a.command != "train") {
    const std::string resume = c.checkpoint.resume.empty() ? "auto" : c.checkpoint.resume;
    checkpoint = engine::resolve_resume(c.checkpoint.dir, resume);
    ENGINE_CHECK(!checkpoint.empty(), "engine " + a.command + ": no checkpoint found in " +
                                          c.checkpoint.dir + " (give --checkpoint DIR)");
  }
  return c;
}

// Next token from last-position logits: greedy at temperature 0, else softmax(logits / T) over
// the top k (k <= 0: all).
int32_t pick_token(const std::vector<float>& logits, double temperature, int64_t top_k,
                   core::Rng& rng) {
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  if (temperature <= 0)
    return *std::max_element(order.begin(), order.end(),
                             [&](int32_t a, int32_t b) { return logits[a] < logits[b]; });
  const size_t k =
      top_k > 0 ? std::min<size_t>(static_cast<size_t>(top_k), order.size()) : order.size();
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> p(k);
  double sum = 0;
  for (size_t j = 0; j < k; ++j) {
    p[j] = std::exp((logits[order[j]] - logits[order[0]]) / temperature);
    sum += p[j];
  }
  double u = rng.next_uniform() * sum;
  for (size_t j = 0; j < k; ++j) {
    u -= p[j];
    if (u <= 0) return order[j];
  }
  return order[k - 1];
}

int run_sample(engine::Trainer& trainer, const Args& a) {
  const auto opt = [&](const std::string& key, const std::string& fallback) {
    auto it = a.options.find(key);
    return it == a.options.end() ? fallback : it->second;
  };
  const std::string tokenizer_dir = opt("--tokenizer", "data/tokenizer");
  std::unique_ptr<data::Gpt2Tokenizer> tokenizer;
  if (std::filesystem::exists(std::filesystem::path(tokenizer_dir) / "encoder.json"))
    tokenizer = std::make_unique<data::Gpt2Tokenizer>(tokenizer_dir);
  std::vector<int32_t> tokens;
  const std::string prompt = opt("--prompt", "");
  if (!prompt.empty()) {
    ENGINE_CHECK(tokenizer != nullptr, "sample: --prompt needs the GPT-2 tokenizer files in " +
                                           tokenizer_dir + " (scripts/prepare_data.sh)");
    tokens = tokenizer->encode(prompt);
    for (int32_t t : tokens)
      ENGINE_CHECK(t < trainer.config().model.vocab_size,
                   "sample: the prompt has token id " + std::to_string(t) +
                       ", outside this model's vocabulary of " +
                       std::to_string(trainer.config().model.vocab_size));
  }
  if (tokens.empty())
    tokens.push_back(data::Gpt2Tokenizer::kEndOfText %
                     static_cast<int32_t>(trainer.config().model.vocab_size));
  const int64_t n = std::stoll(opt("--tokens", "64"));
  const double temperature = std::stod(opt("--temperature", "0.8"));
  const int64_t top_k = std::stoll(opt("--top_k", "40"));
  core::Rng rng(std::stoull(opt("--seed", "0")));
  const size_t prompt_len = tokens.size();
  const size_t T = static_cast<size_t>(trainer.config().model.seq_len);
  for (int64_t i = 0; i < n; ++i) {
    const size_t start = tokens.size() > T ? tokens.size() - T : 0;
    std::vector<int32_t> context(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
    std::vector<float> logits =
        trainer.model().last_logits(context.data(), 1, static_cast<int>(context.size()));
    tokens.push_back(pick_token(logits, temperature, top_k, rng));
  }
  if (tokenizer) {
    std::printf("%s\n", tokenizer->decode(tokens).c_str());
  } else {
    std::printf("(no tokenizer in %s: token ids)\n", tokenizer_dir.c_str());
    for (size_t i = 0; i < tokens.size(); ++i)
      std::printf("%s%d", i == 0 ? "" : (i == prompt_len ? " | " : " "), tokens[i]);
    std::printf("\n");
  }
  return 0;
}

int run(int argc, char** argv, comm::Communicator& world_comm) {
  Args a = parse_args(argc, argv);
  if (a.command == "config-reference") {
    if (world_comm.rank() == 0) std::printf("%s", engine::config_reference_markdown().c_str());
    return 0;
  }
  std::string checkpoint;
  engine::Config config = command_config(a, checkpoint);
  if (a.print_config) {
    if (world_comm.rank() == 0) std::printf("%s", engine::config_to_yaml(config).c_str());
    return 0;
  }
  // Every collective from here on is watched: a rank that does not arrive ends the job.
  comm::Watchdog watchdog(config.comm.timeout_s);
  comm::WatchedCommunicator watched(world_comm, watchdog);
  comm::Communicator& world = watched;
  if (a.command == "train") {
    engine::install_stop_signals();
    // A file-size limit then fails the write (EFBIG, reported with the file's name) instead of
    // killing the rank.
    std::signal(SIGXFSZ, SIG_IGN);
    // Rank 0 waits (up to 60 s) until no rank of an earlier run on these folders is alive,
    // then every rank holds the lock for the whole run.
    const std::vector<std::string> dirs = {config.log.dir, config.checkpoint.dir};
    std::unique_ptr<engine::RunLock> lock;
    if (world.rank() == 0) {
      lock = std::make_unique<engine::RunLock>(dirs, engine::RunLock::Mode::Exclusive, 60.0);
      lock->downgrade();
      engine::prepare_fresh_start(config);
    }
    world.barrier();
    if (world.rank() != 0)
      lock = std::make_unique<engine::RunLock>(dirs, engine::RunLock::Mode::Shared, 60.0);
    engine::check_model_fits_memory(config);
    engine::Trainer trainer(config, world);
    if (trainer.micro_rows() != config.train.micro_batch)
      spdlog::warn(
          "train.micro_batch = {} is not what runs: train.batch_tokens = {} gives {} sequences "
          "per rank on {} ranks, taken as {} micro-steps of {} sequences (every micro-step "
          "holds the same number)",
          config.train.micro_batch, config.train.batch_tokens,
          trainer.micro_rows() * trainer.grad_accum(), world.size(), trainer.grad_accum(),
          trainer.micro_rows());
    try {
      trainer.run();
    } catch (const engine::StoppedBySignal& stopped) {
      spdlog::info("{}: exiting with status {}", stopped.what(), stopped.exit_status());
      return stopped.exit_status();
    }
    return 0;
  }
  engine::check_model_fits_memory(config);
  const bool need_val = a.command == "eval";
  engine::Trainer trainer(config, world, /*with_train_data=*/false, need_val);
  trainer.load_checkpoint(checkpoint, /*params_only=*/true);
  if (a.command == "eval") {
    const double loss = trainer.evaluate();
    spdlog::info("checkpoint {} step {}: val_loss:{:.4f} over {} tokens", checkpoint,
                 engine::read_manifest(checkpoint).step, loss, config.train.val_tokens);
    return 0;
  }
  if (world.rank() != 0) return 0;
  if (a.command == "export") {
    auto it = a.options.find("--out");
    ENGINE_CHECK(it != a.options.end(), "engine export needs --out FILE.safetensors");
    model::save_weights(trainer.model(), it->second);
    spdlog::info("exported {} ({} parameters) to {}", checkpoint,
                 trainer.model().table().total_numel(), it->second);
    return 0;
  }
  return run_sample(trainer, a);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      print_usage();
      std::printf("\nbackend: %s; CUDA device present: %s\n", core::cpu_backend().name(),
                  core::cuda_available() ? "yes" : "no");
      return 0;
    }
  }
  comm::MpiSession session(&argc, &argv);
  spdlog::set_pattern("%v");
  if (session.world_rank() != 0) spdlog::set_level(spdlog::level::off);
  int code = 0;
  {
    auto world = comm::make_mpi_world();
    code = comm::run_guarded([&] { return run(argc, argv, *world); });
  }
  return code;
}
