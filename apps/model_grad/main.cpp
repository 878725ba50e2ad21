// model_grad: one forward and backward of the GPT on a batch from a token shard, writing the loss
// and every parameter's gradient to safetensors (for checks against other implementations).
//
//   model_grad --config C.yaml [--set key=value ...] [--weights W.safetensors] --tokens T.bin
//              --batch B --out G.safetensors [--save-weights W2.safetensors] [--windows W1,W2]
//              [--mtp "W0 W1 ..."] [--prefix-weight W --prefix-table P.txt]
//
// The model is the `model:` section of a config, read by the engine's own config loader (so
// --set, the checks and the error messages are the engine's; train.seed seeds the
// initialisation). A file with only `model:` is enough; a whole engine config works too. Row b of
// the batch is tokens [b(T+1), (b+1)(T+1)) of the shard, T = model.seq_len: inputs are its first T
// tokens, targets its last T. Without --weights the seeded initialisation is used. --mtp and
// --prefix-weight set record #89's training loss (Gpt::set_loss_weights: the weights of the
// targets t+1, t+2, ... and of the prefix targets); --prefix-table holds each token's prefix
// token (-1: none), model.vocab_size integers separated by white space.
// --windows sets the long attention window to each in turn before the step (record #89's YaRN
// rescales at each change).
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "data/token_shard.h"
#include "engine/config.h"
#include "engine/model_loading.h"
#include "model/gpt.h"
#include "model/weights_io.h"

namespace {

int run(int argc, char** argv) {
  std::map<std::string, std::string> args;
  std::vector<std::string> sets;
  const std::vector<std::string> known = {
      "--config",       "--weights", "--tokens",        "--batch",        "--out",    "--set",
      "--save-weights", "--mtp",     "--prefix-weight", "--prefix-table", "--windows"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    ENGINE_CHECK(std::find(known.begin(), known.end(), a) != known.end(),
                 "model_grad: unknown argument '" + a + "'");
    ENGINE_CHECK(i + 1 < argc, "model_grad: " + a + " needs a value");
    if (a == "--set")
      sets.push_back(argv[++i]);
    else
      args[a] = argv[++i];
  }
  for (const char* need : {"--config", "--tokens", "--batch", "--out"}) {
    ENGINE_CHECK(args.count(need), std::string("model_grad: ") + need + " is required");
  }
  const model::ModelConfig config = engine::model_config_of(
      engine::load_config(args["--config"], sets, engine::ConfigUse::ModelOnly));
  const int B = std::stoi(args["--batch"]);
  const int T = config.seq_len;
  ENGINE_CHECK(B > 0, "model_grad: --batch must be positive");

  const std::vector<uint16_t> shard = data::read_shard(args["--tokens"], config.vocab_size);
  const size_t need = size_t(B) * (T + 1);
  ENGINE_CHECK(shard.size() >= need, args["--tokens"] + ": holds " + std::to_string(shard.size()) +
                                         " tokens, batch " + std::to_string(B) + " x (T+1=" +
                                         std::to_string(T + 1) + ") needs " + std::to_string(need));
  std::vector<int32_t> inputs(size_t(B) * T), targets(size_t(B) * T);
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      inputs[size_t(b) * T + t] = shard[size_t(b) * (T + 1) + t];
      targets[size_t(b) * T + t] = shard[size_t(b) * (T + 1) + t + 1];
    }
  }

  model::Gpt gpt(config, core::cpu_backend());
  if (args.count("--weights")) {
    model::load_weights(gpt, args["--weights"]);
  } else {
    gpt.init_weights();
  }
  if (args.count("--save-weights")) model::save_weights(gpt, args["--save-weights"]);
  if (args.count("--prefix-table")) {
    std::ifstream in(args["--prefix-table"]);
    ENGINE_CHECK(in.good(), "model_grad: cannot open --prefix-table " + args["--prefix-table"]);
    std::vector<int32_t> table;
    for (int32_t v = 0; in >> v;)
      table.push_back(v);
    gpt.set_prefix_table(table);
  }
  if (args.count("--mtp") || args.count("--prefix-weight")) {
    std::vector<double> mtp;
    std::istringstream in(args.count("--mtp") ? args["--mtp"] : "1");
    for (double w = 0; in >> w;)
      mtp.push_back(w);
    gpt.set_loss_weights(mtp,
                         args.count("--prefix-weight") ? std::stod(args["--prefix-weight"]) : 0.0);
  }
  if (args.count("--windows")) {
    const auto windows = engine::parse_block_list(args["--windows"]);
    ENGINE_CHECK(
        windows && !windows->empty(),
        "model_grad: --windows must be a comma list of windows, got '" + args["--windows"] + "'");
    for (int w : *windows)
      gpt.set_attention_window(w);
  }
  gpt.zero_grad();
  const float loss = gpt.forward(inputs.data(), targets.data(), B, T);
  gpt.backward();
  model::save_gradients(gpt, args["--out"], loss, gpt.ce_loss());
  std::printf("model_grad: loss %.8f ce %.8f (%s)\n", loss, gpt.ce_loss(), args["--out"].c_str());
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
