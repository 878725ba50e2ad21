// engine: the MPI-launched training executable and its subcommands.
//
//   mpirun -np N engine [train] (--config C.yaml | --checkpoint DIR) [--set key=value ...]
//   mpirun -np N engine eval    (--config C.yaml | --checkpoint DIR) [--all] [--set ...]
//   engine export  (--config C.yaml | --checkpoint DIR) --out PATH [--format engine|hf]
//   engine sample  (--config C.yaml | --checkpoint DIR) [--prompt TEXT] [--tokens N]
//                  [--temperature X] [--top_k K] [--seed S] [--tokenizer DIR]
//   engine config-reference            the config keys as a Markdown table
//   engine --print-config --config C   the effective config, then exit
//   engine SUBCOMMAND --help           the subcommand's flags and their defaults
//   engine --version                   the version and the commit it was built from
// Exit status: 0 done; 2 refused before any work (a usage, config, data, checkpoint or init_from
// error: nothing was written); 1 failed while running; 3 the model diverged (engine/
// training_health.h); 143 / 130 stopped by SIGTERM / SIGINT after saving. An error every rank
// finds is printed once by rank 0 and every rank exits with its status; an error on only some
// ranks aborts the job naming them (comm/abort.h).
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <numeric>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "comm/nccl_communicator.h"
#include "comm/staged_communicator.h"
#include "comm/watchdog.h"
#include "comm/watched_communicator.h"
#include "core/backend.h"
#include "core/backend_factory.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/transfer.h"
#include "data/gpt2_tokenizer.h"
#include "data/shard_set.h"
#include "data/val_loader.h"
#include "engine/batch_geometry.h"
#include "engine/build_info.h"
#include "engine/checkpoint/checkpoint_files.h"
#include "engine/config.h"
#include "engine/device_select.h"
#include "engine/export_target.h"
#include "engine/lr_schedule.h"
#include "engine/model_loading.h"
#include "engine/preflight.h"
#include "engine/run_lock.h"
#include "engine/stop_signal.h"
#include "engine/trainer.h"
#include "engine/training_health.h"
#include "engine/validation.h"
#include "model/hf_gpt2.h"
#include "model/weights_io.h"

namespace {

// Input refused before any work (usage, config, data, checkpoint, init_from): exit status 2,
// printed once when every rank has it (comm::run_guarded).
constexpr int kExitRefused = 2;
class UsageError : public comm::ExitStatusError {
 public:
  explicit UsageError(const std::string& message) : comm::ExitStatusError(message, kExitRefused) {}
};

// Runs a step of the set-up; its errors are refusals (exit status 2), not failures.
template <typename Fn>
auto refused_on_error(Fn&& fn) {
  try {
    return fn();
  } catch (const core::Error& e) {
    throw UsageError(e.what());
  }
}

// One flag of a subcommand: its value's name ("" for a switch), default ("" for none) and doc.
struct Flag {
  const char* name;
  const char* value;
  const char* default_value;
  const char* doc;
};

struct Subcommand {
  const char* name;
  const char* synopsis;
  const char* summary;
  std::vector<Flag> flags;
};

const std::vector<Flag>& config_flags() {
  static const std::vector<Flag> flags = {
      {"--config", "FILE", "", "YAML config (keys: engine config-reference)"},
      {"--set", "KEY=VALUE", "", "override a config key (repeatable; wins over the file)"},
  };
  return flags;
}

const std::vector<Subcommand>& subcommands() {
  static const std::vector<Subcommand> table = [] {
    const Flag checkpoint = {"--checkpoint", "DIR", "",
                             "checkpoint folder; its saved config is used (--set still applies); "
                             "without it, --config and checkpoint.resume (default: the newest "
                             "checkpoint in checkpoint.dir)"};
    std::vector<Subcommand> t = {
        {"train",
         "mpirun -np N engine [train] (--config C.yaml | --checkpoint DIR) [--set KEY=VALUE ...]",
         "Train per the config: resume, evaluate, checkpoint, log (the default subcommand).",
         {{"--checkpoint", "DIR", "",
           "resume from this checkpoint folder with its saved config (--set still applies; "
           "log.dir and checkpoint.dir are the saved ones)"},
          {"--print-config", "", "", "print the effective config and exit"}}},
        {"eval",
         "mpirun -np N engine eval (--config C.yaml | --checkpoint DIR) [--all]",
         "Validation loss of a checkpoint.",
         {checkpoint,
          {"--all", "", "",
           "evaluate the whole validation split (every whole sequence of data.val) instead of "
           "train.val_tokens"}}},
        {"export",
         "engine export (--config C.yaml | --checkpoint DIR) --out PATH [--format F]",
         "Write a checkpoint's weights for other tools.",
         {checkpoint,
          {"--out", "PATH", "", "output: a .safetensors file (engine) or a folder (hf); required"},
          {"--format", "F", "engine",
           "engine (the engine's names, model.* metadata) | hf (Hugging Face GPT2LMHeadModel "
           "folder: config.json + model.safetensors; arch gpt2 only)"}}},
        {"sample",
         "engine sample (--config C.yaml | --checkpoint DIR) [--prompt TEXT] ...",
         "Generate text from a checkpoint.",
         {checkpoint,
          {"--prompt", "TEXT", "", "text to continue (empty: start from <|endoftext|>)"},
          {"--tokens", "N", "64", "tokens to generate (integer >= 1)"},
          {"--temperature", "X", "0.8", "softmax temperature (>= 0; 0 = greedy)"},
          {"--top_k", "K", "40", "sample among the K most likely tokens (>= 0; 0 = all)"},
          {"--seed", "S", "0", "sampling seed (integer >= 0)"},
          {"--tokenizer", "DIR", "data/tokenizer",
           "GPT-2 vocabulary folder (token ids are printed when it is absent)"}}},
        {"config-reference",
         "engine config-reference",
         "Print every config key with its type, default and meaning (Markdown).",
         {}},
    };
    for (Subcommand& c : t) {
      if (std::string(c.name) == "config-reference") continue;
      c.flags.insert(c.flags.begin(), config_flags().begin(), config_flags().end());
    }
    return t;
  }();
  return table;
}

const Subcommand* find_subcommand(const std::string& name) {
  for (const Subcommand& c : subcommands())
    if (name == c.name) return &c;
  return nullptr;
}

void print_usage() {
  std::printf("usage:\n");
  for (const Subcommand& c : subcommands())
    std::printf("  %s\n", c.synopsis);
  std::printf(
      "\n"
      "Trains a GPT with ZeRO-sharded state (see README.md and `engine config-reference`).\n"
      "`engine SUBCOMMAND --help` lists a subcommand's flags and their defaults;\n"
      "`engine --version` the version and the commit it was built from.\n");
}

void print_subcommand_help(const Subcommand& c) {
  std::printf("usage: %s\n\n%s\n\nflags:\n", c.synopsis, c.summary);
  constexpr size_t kIndent = 23, kWidth = 100;
  const auto print_flag = [&](std::string left, const std::string& doc) {
    // The doc, word-wrapped into the right-hand column.
    std::string line = "  " + left;
    line.resize(std::max(line.size() + 1, kIndent), ' ');
    std::istringstream words(doc);
    bool first = true;
    for (std::string w; words >> w; first = false) {
      if (!first && line.size() + 1 + w.size() > kWidth) {
        std::printf("%s\n", line.c_str());
        line = std::string(kIndent, ' ');
        first = true;
      }
      line += (first ? "" : " ") + w;
    }
    std::printf("%s\n", line.c_str());
  };
  for (const Flag& f : c.flags) {
    print_flag(std::string(f.name) + (*f.value ? std::string(" ") + f.value : ""),
               std::string(f.doc) +
                   (*f.default_value ? std::string(" (default ") + f.default_value + ")" : ""));
  }
  print_flag("--help", "this text");
}

struct Args {
  std::string command = "train";
  std::string config;
  std::string checkpoint;
  std::vector<std::string> sets;
  std::map<std::string, std::string> options;  // the subcommand's other flags, as given
  bool print_config = false;
  bool help = false;

  // A flag's value, or its default from the table.
  std::string option(const std::string& name) const {
    if (auto it = options.find(name); it != options.end()) return it->second;
    for (const Flag& f : find_subcommand(command)->flags)
      if (name == f.name) return f.default_value;
    return "";
  }
};

// A flag's value as an integer >= min, or a UsageError naming the flag.
int64_t integer_flag(const Args& a, const std::string& name, int64_t min) {
  const std::string v = a.option(name);
  char* end = nullptr;
  errno = 0;
  const long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0' || errno != 0 || x < min)
    throw UsageError("engine " + a.command + ": " + name + " '" + v +
                     "' is not an integer >= " + std::to_string(min));
  return x;
}

double number_flag(const Args& a, const std::string& name, double min) {
  const std::string v = a.option(name);
  char* end = nullptr;
  const double x = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || !std::isfinite(x) || x < min)
    throw UsageError("engine " + a.command + ": " + name + " '" + v +
                     "' is not a number >= " + fmt::format("{}", min));
  return x;
}

Args parse_args(int argc, char** argv) {
  Args a;
  int i = 1;
  if (i < argc && find_subcommand(argv[i]) != nullptr) a.command = argv[i++];
  const Subcommand& sub = *find_subcommand(a.command);
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError("engine " + a.command + ": " + arg + " needs a value");
      return argv[++i];
    };
    const auto flag = std::find_if(sub.flags.begin(), sub.flags.end(),
                                   [&](const Flag& f) { return arg == f.name; });
    if (arg == "--help" || arg == "-h") {
      a.help = true;
    } else if (arg.rfind("--set=", 0) == 0 && sub.flags.size() > 0) {
      a.sets.push_back(arg.substr(6));
    } else if (flag == sub.flags.end()) {
      throw UsageError("engine " + a.command + ": unknown argument '" + arg + "' (engine " +
                       a.command + " --help lists its flags)");
    } else if (arg == "--config") {
      a.config = value();
    } else if (arg == "--checkpoint") {
      a.checkpoint = value();
    } else if (arg == "--set") {
      a.sets.push_back(value());
    } else if (arg == "--print-config") {
      a.print_config = true;
    } else {
      a.options[arg] = *flag->value ? value() : "true";
    }
  }
  if (a.command == "sample") {  // checked before any work, so a typo costs nothing
    integer_flag(a, "--tokens", 1);
    number_flag(a, "--temperature", 0);
    integer_flag(a, "--top_k", 0);
    integer_flag(a, "--seed", 0);
  }
  if (a.command == "export") {
    if (!a.options.count("--out")) throw UsageError("engine export needs --out PATH");
    const std::string format = a.option("--format");
    if (format != "engine" && format != "hf")
      throw UsageError("engine export: --format must be engine or hf, got '" + format + "'");
  }
  return a;
}

// The config of a subcommand and the checkpoint it reads ("" for train).
engine::Config command_config(const Args& a, std::string& checkpoint) {
  if (!a.checkpoint.empty() && !a.config.empty())
    throw UsageError("engine " + a.command +
                     ": give --config FILE or --checkpoint DIR, not both (a checkpoint carries "
                     "its config; --set changes it)");
  if (!a.checkpoint.empty()) {
    engine::verify_checkpoint(a.checkpoint);
    engine::Manifest m = engine::read_manifest(a.checkpoint);
    std::vector<std::string> sets = a.sets;
    // train resumes from the folder given; the other subcommands read it and resume nothing.
    sets.insert(sets.begin(), "checkpoint.resume=" + (a.command == "train" ? a.checkpoint : ""));
    engine::Config c = engine::parse_config(m.config_yaml, a.checkpoint + "/manifest.yaml", sets);
    if (a.command == "train") {
      if (!a.print_config) engine::prepare_run_folders(c);
    } else {
      checkpoint = a.checkpoint;
    }
    return c;
  }
  if (a.config.empty())
    throw UsageError("engine " + a.command + " needs --config FILE or --checkpoint DIR (engine " +
                     a.command + " --help)");
  engine::Config c = engine::load_config(a.config, a.sets);
  if (a.command == "train" && !a.print_config) engine::prepare_run_folders(c);
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

int run_sample(model::Gpt& model, const Args& a) {
  const std::string tokenizer_dir = a.option("--tokenizer");
  std::unique_ptr<data::Gpt2Tokenizer> tokenizer;
  if (std::filesystem::exists(std::filesystem::path(tokenizer_dir) / "encoder.json"))
    tokenizer = std::make_unique<data::Gpt2Tokenizer>(tokenizer_dir);
  std::vector<int32_t> tokens;
  const std::string prompt = a.option("--prompt");
  if (!prompt.empty()) {
    ENGINE_CHECK(tokenizer != nullptr, "sample: --prompt needs the GPT-2 tokenizer files in " +
                                           tokenizer_dir + " (scripts/prepare_data.sh)");
    tokens = tokenizer->encode(prompt);
    for (int32_t t : tokens)
      ENGINE_CHECK(t < model.config().vocab_size, "sample: the prompt has token id " +
                                                      std::to_string(t) +
                                                      ", outside this model's vocabulary of " +
                                                      std::to_string(model.config().vocab_size));
  }
  if (tokens.empty())
    tokens.push_back(data::Gpt2Tokenizer::kEndOfText %
                     static_cast<int32_t>(model.config().vocab_size));
  const int64_t n = integer_flag(a, "--tokens", 1);
  const double temperature = number_flag(a, "--temperature", 0);
  const int64_t top_k = integer_flag(a, "--top_k", 0);
  core::Rng rng(static_cast<uint64_t>(integer_flag(a, "--seed", 0)));
  const size_t prompt_len = tokens.size();
  const size_t T = static_cast<size_t>(model.config().seq_len);
  for (int64_t i = 0; i < n; ++i) {
    const size_t start = tokens.size() > T ? tokens.size() - T : 0;
    std::vector<int32_t> context(tokens.begin() + static_cast<std::ptrdiff_t>(start), tokens.end());
    std::vector<float> logits =
        model.last_logits(context.data(), 1, static_cast<int>(context.size()));
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

// Parses the command line and the config. Every rank reads the same arguments and files, so a
// usage or config error normally shows on every rank: then rank 0 prints it once and every rank
// exits with 2, without the MPI abort banner. Should only some ranks fail (a file that only some
// nodes can read), they abort the job as any runtime failure does (comm::agree_no_error).
bool parse_everywhere(int argc, char** argv, Args& a, engine::Config& config,
                      std::string& checkpoint) {
  std::string error;
  try {
    a = parse_args(argc, argv);
    if (a.command != "config-reference") config = command_config(a, checkpoint);
  } catch (const std::exception& e) {
    error = e.what();
  }
  return comm::agree_no_error(error);
}

// Where this rank computes and what moves its tensors: on a GPU its own CUDA backend and an
// NCCL communicator over the world, or the world itself through host staging buffers
// (comm.device_collectives: mpi); scalars and control stay on MPI. On the CPU the CPU backend
// and the world communicator itself (or staged through copies, with mpi).
struct RankDevice {
  std::shared_ptr<core::Backend> backend;
  std::unique_ptr<comm::Communicator> device_comm;  // NCCL or staged; null for plain MPI
  comm::Communicator* tensors = nullptr;
};

// Chooses the device per the config's `device` key (engine/device_select.h) and builds it.
// A refusal on every rank (device: cuda without CUDA or GPU, more ranks than GPUs) is printed
// once, exit status 2, like a config error.
bool make_rank_device(const engine::Config& config, const comm::MpiSession& session,
                      comm::Communicator& mpi_world, comm::Communicator& world, RankDevice& out) {
  engine::DeviceFacts facts;
  facts.cuda_built = core::cuda_built();
  facts.visible_gpus = core::cuda_device_count();
  facts.local_rank = session.node_rank();
  facts.local_size = session.node_ranks();
  facts.share_gpus = config.comm.device_collectives == "mpi";
  const engine::DeviceSelection chosen = engine::select_device(config.device, facts);
  if (!comm::agree_no_error(chosen.error)) return false;
  out.backend = core::make_backend(chosen.device);
  if (config.comm.device_collectives == "mpi") {
    // On the CPU the staged path only adds copies; it runs there so that its code is tested
    // through whole training runs (e2e_device_collectives_mpi).
    out.device_comm = comm::make_staged(world, *out.backend);
  } else if (!core::is_host_memory(out.backend->device())) {
    out.device_comm = comm::make_nccl(mpi_world, *out.backend);
  }
  // MPI moves host memory in place: the world itself carries the tensors of the CPU backend.
  out.tensors = out.device_comm ? out.device_comm.get() : &world;
  return true;
}

// Rank 0's verdict on a step only it runs, shared: every rank learns whether it failed, and rank
// 0 prints its error once.
bool rank0_ok(comm::Communicator& world, const std::string& error) {
  int64_t failed = error.empty() ? 0 : 1;
  world.all_reduce(&failed, 1, comm::ReduceOp::Max);
  if (failed != 0 && world.rank() == 0) std::fprintf(stderr, "%s\n", error.c_str());
  return failed == 0;
}

// The largest number of validation tokens the whole split holds: every whole sequence of
// data.val, rounded down to a multiple of the world size.
int64_t whole_val_split_tokens(const engine::Config& config, int world_size) {
  const data::ShardSet shards(config.data.val, config.model.seq_len, config.model.vocab_size);
  const int64_t sequences = shards.num_sequences() / world_size * world_size;
  ENGINE_CHECK(sequences > 0, "engine eval --all: '" + config.data.val + "' holds " +
                                  std::to_string(shards.num_sequences()) +
                                  " sequences, fewer than the world size");
  return sequences * config.model.seq_len;
}

int run(int argc, char** argv, const comm::MpiSession& session, comm::Communicator& world_comm) {
  Args a;
  engine::Config config;
  std::string checkpoint;
  if (!parse_everywhere(argc, argv, a, config, checkpoint)) return kExitRefused;
  if (a.command == "config-reference") {
    if (world_comm.rank() == 0) std::printf("%s", engine::config_reference_markdown().c_str());
    return 0;
  }
  if (a.print_config) {
    if (world_comm.rank() == 0) std::printf("%s", engine::config_to_yaml(config).c_str());
    return 0;
  }
  // Every collective from here on is watched: a rank that does not arrive ends the job.
  comm::Watchdog watchdog(config.comm.timeout_s);
  comm::WatchedCommunicator watched(world_comm, watchdog);
  comm::Communicator& world = watched;
  RankDevice device;  // outlives the trainer: its tensors live on this backend
  if (!make_rank_device(config, session, world_comm, world, device)) return kExitRefused;
  if (a.command == "train") {
    for (const std::string& warning : engine::config_warnings(config))
      spdlog::warn("{}", warning);  // rank 0's logger only
    engine::install_stop_signals();
    // A file-size limit then fails the write (EFBIG, reported with the file's name) instead of
    // killing the rank.
    std::signal(SIGXFSZ, SIG_IGN);
    // Rank 0 waits (up to 60 s) until no rank of an earlier run on these folders is alive,
    // then every rank holds the lock for the whole run.
    const std::vector<std::string> dirs = {config.log.dir, config.checkpoint.dir};
    std::unique_ptr<engine::RunLock> lock;
    std::string refused;
    if (world.rank() == 0) {
      try {
        engine::check_run_files(config);
        lock = std::make_unique<engine::RunLock>(dirs, engine::RunLock::Mode::Exclusive, 60.0);
        lock->downgrade();
        engine::prepare_fresh_start(config);
      } catch (const core::Error& e) {
        refused = e.what();
      }
    }
    if (!rank0_ok(world, refused)) return kExitRefused;
    if (world.rank() != 0)
      lock = std::make_unique<engine::RunLock>(dirs, engine::RunLock::Mode::Shared, 60.0);
    refused_on_error([&] { engine::check_model_fits_memory(config); });
    std::unique_ptr<engine::Trainer> trainer = refused_on_error([&] {
      return std::make_unique<engine::Trainer>(config, world, *device.tensors, *device.backend);
    });
    const engine::BatchGeometry& batch = trainer->geometry();
    if (batch.micro_rows != config.train.micro_batch)
      spdlog::warn(
          "train.micro_batch = {} is not what runs: train.batch_tokens = {} gives {} sequences "
          "per rank on {} ranks, taken as {} micro-steps of {} sequences (every micro-step "
          "holds the same number)",
          config.train.micro_batch, config.train.batch_tokens, batch.rows_per_rank, world.size(),
          batch.grad_accum, batch.micro_rows);
    try {
      trainer->run();
    } catch (const engine::StoppedBySignal& stopped) {
      spdlog::info("{}: exiting with status {}", stopped.what(), stopped.exit_status());
      return stopped.exit_status();
    } catch (const engine::TrainingDiverged& diverged) {
      // Every rank reached the same verdict from the same global values: one line, no abort.
      if (world.rank() == 0) spdlog::error("{}", diverged.what());
      return engine::TrainingDiverged::kExitStatus;
    } catch (const core::Error& e) {
      // Before the first step (resume, init_from): a refusal; after it, a failure.
      if (!trainer->started()) throw UsageError(e.what());
      throw;
    }
    return 0;
  }
  // eval, export and sample: the model and its weights (and for eval the validation data),
  // no optimizers, sharding or training data.
  if (a.command == "export")
    refused_on_error([&] {
      engine::check_export_target(a.option("--out"), checkpoint, a.option("--format") == "hf");
    });
  refused_on_error([&] { engine::check_model_fits_memory(config); });
  const bool eval = a.command == "eval";
  if (eval && a.options.count("--all"))
    config.train.val_tokens =
        refused_on_error([&] { return whole_val_split_tokens(config, world.size()); });
  std::unique_ptr<data::ValLoader> val;
  if (eval)
    val = refused_on_error([&] {
      return engine::make_val_loader(config, engine::BatchGeometry::of(config, world.size()),
                                     world.rank(), world.size());
    });
  if (a.command == "export" && a.option("--format") == "hf") {
    // A model without counterpart is refused before any work, as the usage errors are.
    const std::string why = model::hf_gpt2_incompatibility(engine::model_config_of(config));
    if (!why.empty())
      throw UsageError(
          "engine export --format hf: this model has no Hugging Face GPT-2 "
          "counterpart: " +
          why);
  }
  // sample's standard output is the text alone.
  if (a.command != "sample") engine::log_rank_devices(world, *device.backend);
  std::unique_ptr<model::Gpt> model =
      refused_on_error([&] { return engine::load_model(config, checkpoint, *device.backend); });
  if (eval) {
    const int64_t step = engine::read_manifest(checkpoint).step;
    engine::apply_window_schedule(*model, step, config.train.steps);  // as the run validated it
    const double loss = engine::validation_loss(*model, *val, world);
    spdlog::info("checkpoint {} step {}: val_loss:{:.4f} over {} tokens{}", checkpoint, step, loss,
                 config.train.val_tokens,
                 a.options.count("--all") ? " (the whole validation split)" : "");
    return 0;
  }
  if (world.rank() != 0) return 0;
  if (a.command == "export") {
    const std::string out = a.option("--out");
    if (a.option("--format") == "hf")
      model::save_hf_gpt2(*model, out);
    else
      model::save_weights(*model, out);
    spdlog::info("exported {} ({} parameters) to {}", checkpoint, model->table().total_numel(),
                 out);
    return 0;
  }
  return run_sample(*model, a);
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--version") {
      std::printf("%s\n", engine::engine_build_line().c_str());
      return 0;
    }
    if (arg == "--help" || arg == "-h") {
      const Subcommand* sub = argc > 1 ? find_subcommand(argv[1]) : nullptr;
      if (sub != nullptr && i > 1) {
        print_subcommand_help(*sub);
      } else {
        print_usage();
        std::printf("\nCPU backend: %s; CUDA backend built: %s; CUDA devices visible: %d\n",
                    core::cpu_backend().name(), core::cuda_built() ? "yes" : "no",
                    core::cuda_device_count());
      }
      return 0;
    }
  }
  comm::MpiSession session(&argc, &argv);
  spdlog::set_pattern("%v");
  if (session.world_rank() != 0) spdlog::set_level(spdlog::level::off);
  int code = 0;
  {
    auto world = comm::make_mpi_world();
    code = comm::run_guarded([&] { return run(argc, argv, session, *world); });
  }
  return code;
}
