// dump_batches: what an engine run reads, for another trainer to replay it exactly.
//
//   dump_batches --config C.yaml [--set key=value ...] --steps N --out DIR
//
// Writes three files the PyTorch side-by-side (tests/model/torch_reference.py --train) reads:
//   DIR/train.bin          the global batch of steps 1..N in training order, as a token shard
//                          whose row r (tokens [r(T+1), (r+1)(T+1))) is the inputs of a sequence
//                          followed by its last target; rows = N * train.batch_tokens / T;
//   DIR/val.bin            the validation sequences every evaluation reads, same row layout;
//   DIR/init.safetensors   the seeded initial weights (the model config in its metadata).
// The order is the engine's own: the data loader's global order is independent of the world
// size and the micro-steps, so one loader at world 1 yields what every run of the config reads.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "data/data_loader.h"
#include "data/shard_writer.h"
#include "data/val_loader.h"
#include "engine/config.h"
#include "engine/model_loading.h"
#include "engine/stage_schedule.h"
#include "model/gpt.h"
#include "model/weights_io.h"

namespace {

namespace fs = std::filesystem;

// Appends each row of `batch` as T inputs and the last target (T+1 tokens).
void append_rows(const data::Batch& batch, std::vector<int32_t>& out) {
  for (int64_t r = 0; r < batch.rows; ++r) {
    const int32_t* x = batch.inputs.data() + r * batch.seq_len;
    out.insert(out.end(), x, x + batch.seq_len);
    out.push_back(batch.targets[static_cast<size_t>((r + 1) * batch.seq_len - 1)]);
  }
}

// One shard file DIR/NAME.bin holding `tokens` (ShardWriter names shards PREFIX_000000.bin).
void write_tokens(const fs::path& dir, const std::string& name,
                  const std::vector<int32_t>& tokens) {
  const std::string prefix = (dir / name).string();
  data::ShardWriter writer(prefix, static_cast<int64_t>(tokens.size()));
  writer.append(tokens);
  ENGINE_CHECK(writer.finish() == 1, "dump_batches: expected one shard for " + prefix);
  fs::rename(data::ShardWriter::shard_path(prefix, 0), dir / (name + ".bin"));
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> args;
  std::vector<std::string> sets;
  const std::vector<std::string> known = {"--config", "--set", "--steps", "--out"};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    ENGINE_CHECK(std::find(known.begin(), known.end(), a) != known.end(),
                 "dump_batches: unknown argument '" + a + "' (expected --config, --set, --steps, " +
                     "--out)");
    ENGINE_CHECK(i + 1 < argc, "dump_batches: " + a + " needs a value");
    if (a == "--set")
      sets.push_back(argv[++i]);
    else
      args[a] = argv[++i];
  }
  for (const char* need : {"--config", "--steps", "--out"})
    ENGINE_CHECK(args.count(need), std::string("dump_batches: ") + need + " is required");
  const engine::Config c = engine::load_config(args["--config"], sets);
  // Its layout is rows of model.seq_len; the stages' document rows change length by stage.
  ENGINE_CHECK(!engine::StageSchedule::of(c).enabled(),
               "dump_batches: train.stages is on: its rows (BOS-aligned documents, a length per "
               "stage) do not fit this file's fixed rows of model.seq_len; dump a config without "
               "train.stages");
  const int64_t steps = std::stoll(args["--steps"]);
  ENGINE_CHECK(steps > 0, "dump_batches: --steps must be positive, got " + args["--steps"]);
  const int64_t T = c.model.seq_len;
  const fs::path dir = args["--out"];
  fs::create_directories(dir);

  data::LoaderOptions lo;
  lo.pattern = c.data.train;
  lo.seq_len = T;
  lo.batch_rows = c.train.batch_tokens / T;
  lo.seed = static_cast<uint64_t>(c.train.seed);
  lo.shuffle = c.data.shuffle;
  lo.shard_whole_batches = c.data.shard_whole_batches;
  lo.vocab_size = c.model.vocab_size;
  const data::DataLoader loader(lo);
  std::vector<int32_t> train;
  data::Batch batch;
  for (int64_t step = 0; step < steps; ++step) {
    loader.load(step, 0, batch);
    append_rows(batch, train);
  }
  write_tokens(dir, "train", train);

  data::ValOptions vo;
  vo.pattern = c.data.val;
  vo.seq_len = T;
  vo.batch_rows = c.train.val_tokens / T;
  vo.val_tokens = c.train.val_tokens;
  vo.vocab_size = c.model.vocab_size;
  const data::ValLoader val(vo);
  std::vector<int32_t> val_tokens;
  for (int64_t step = 0; step < val.num_steps(); ++step) {
    val.load(step, batch);
    append_rows(batch, val_tokens);
  }
  write_tokens(dir, "val", val_tokens);

  model::Gpt gpt(engine::model_config_of(c), core::cpu_backend());
  gpt.init_weights();
  model::save_weights(gpt, (dir / "init.safetensors").string());
  std::printf("dump_batches: %lld steps x %lld rows, %lld validation rows, initial weights -> %s\n",
              static_cast<long long>(steps), static_cast<long long>(lo.batch_rows),
              static_cast<long long>(val_tokens.size() / (T + 1)), dir.string().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
