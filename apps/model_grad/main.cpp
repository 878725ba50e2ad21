// model_grad: one forward and backward of the GPT on a batch from a token shard, writing the loss
// and every parameter's gradient to safetensors (for checks against other implementations).
//
//   model_grad --config C.yaml [--weights W.safetensors] --tokens T.bin --batch B
//              --out G.safetensors [--save-weights W2.safetensors]
//
// Row b of the batch is tokens [b(T+1), (b+1)(T+1)) of the shard, T = model.seq_len: inputs are
// its first T tokens, targets its last T. Without --weights the seeded initialisation is used.
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "engine/core/backend.h"
#include "engine/core/check.h"
#include "engine/data/token_shard.h"
#include "model/gpt.h"
#include "model/weights_io.h"

namespace {

std::string where(const std::string& file, const YAML::Node& node) {
  return file + ":" + std::to_string(node.Mark().line + 1);
}

template <typename T>
T scalar(const std::string& file, const std::string& key, const YAML::Node& node) {
  try {
    return node.as<T>();
  } catch (const YAML::Exception&) {
    ENGINE_FAIL(where(file, node) + ": model key '" + key + "' has a value of the wrong type");
  }
}

// The `model:` section of a YAML file; unknown keys inside it are errors naming file and line.
model::ModelConfig parse_model_config(const std::string& file) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(file);
  } catch (const YAML::Exception& e) {
    ENGINE_FAIL(file + ": " + e.what());
  }
  ENGINE_CHECK(root.IsMap() && root["model"] && root["model"].IsMap(),
               file + ": needs a 'model:' section (a map)");
  model::ModelConfig c;
  for (const auto& kv : root["model"]) {
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    if (key == "n_layer") {
      c.n_layer = scalar<int>(file, key, v);
    } else if (key == "n_head") {
      c.n_head = scalar<int>(file, key, v);
    } else if (key == "d_model") {
      c.d_model = scalar<int>(file, key, v);
    } else if (key == "seq_len") {
      c.seq_len = scalar<int>(file, key, v);
    } else if (key == "vocab_size") {
      c.vocab_size = scalar<int>(file, key, v);
    } else if (key == "arch") {
      c.arch = model::parse_arch(scalar<std::string>(file, key, v));
    } else if (key == "softcap") {
      c.softcap = scalar<float>(file, key, v);
    } else if (key == "seed") {
      c.seed = scalar<uint64_t>(file, key, v);
    } else if (key == "moe") {
      ENGINE_CHECK(v.IsMap(), where(file, v) + ": model.moe must be a map");
      for (const auto& m : v) {
        const std::string mk = m.first.as<std::string>();
        if (mk == "experts") {
          c.moe_experts = scalar<int>(file, "moe." + mk, m.second);
        } else if (mk == "top_k") {
          c.moe_top_k = scalar<int>(file, "moe." + mk, m.second);
        } else if (mk == "aux_weight") {
          c.moe_aux_weight = scalar<float>(file, "moe." + mk, m.second);
        } else {
          ENGINE_FAIL(where(file, m.first) + ": unknown key 'model.moe." + mk + "'");
        }
      }
    } else {
      ENGINE_FAIL(where(file, kv.first) + ": unknown key 'model." + key + "'");
    }
  }
  c.validate();
  return c;
}

int run(int argc, char** argv) {
  std::map<std::string, std::string> args;
  const std::vector<std::string> known = {"--config", "--weights", "--tokens",
                                          "--batch",  "--out",     "--save-weights"};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    ENGINE_CHECK(std::find(known.begin(), known.end(), a) != known.end(),
                 "model_grad: unknown argument '" + a + "'");
    ENGINE_CHECK(i + 1 < argc, "model_grad: " + a + " needs a value");
    args[a] = argv[++i];
  }
  for (const char* need : {"--config", "--tokens", "--batch", "--out"}) {
    ENGINE_CHECK(args.count(need), std::string("model_grad: ") + need + " is required");
  }
  const model::ModelConfig config = parse_model_config(args["--config"]);
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
