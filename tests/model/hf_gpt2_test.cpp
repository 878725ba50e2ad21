// Hugging Face GPT-2 export and import (model/hf_gpt2): an export loads into an independent
// PyTorch GPT2LMHeadModel (tests/model/gpt2_hf_reference.py, float64) whose logits match the
// engine's within 1e-5; that module's random weights import and export again bit for bit; a
// model or file that does not fit is refused naming why.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/check.h"
#include "core/rng.h"
#include "core/safetensors.h"
#include "model/gpt.h"
#include "model/hf_gpt2.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;

model::ModelConfig small_gpt2() {
  model::ModelConfig c;
  c.arch = model::Arch::Gpt2;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.seq_len = 12;
  c.vocab_size = 50257;  // GPT-2's: padded to 50304 inside, cut back on export
  return c;
}

fs::path work_dir(const std::string& name) {
  const fs::path d = fs::path(TEST_WORK_DIR) / ("hf_" + name);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string reference(const std::string& args) {
  return "/usr/bin/python3 " + std::string(HF_REFERENCE) + " " + args;
}

// Every parameter random (biases and LayerNorm weights too, so a swapped name shows), the
// vocabulary padding rows zero as in a trained model.
void randomize(model::Gpt& gpt, uint64_t seed) {
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    const model::ParamInfo& p = gpt.table()[i];
    core::Tensor host = core::Tensor::zeros(p.shape);
    const int64_t valid = p.valid_rows >= 0 ? p.valid_rows * p.shape[1] : p.numel;
    const bool norm = p.name.find("ln") != std::string::npos && p.name.ends_with("weight");
    for (int64_t k = 0; k < valid; ++k)
      host.data<float>()[k] =
          (norm ? 1.0f : 0.0f) + 0.1f * static_cast<float>(core::rng_normal(
                                            seed, static_cast<uint64_t>(k) + 1000000ull * i));
    gpt.backend().copy_from_host(gpt.param(i).raw_data(), host.raw_data(), host.nbytes());
  }
}

TEST(HfGpt2, ExportLoadsIntoTheHuggingFaceModuleWithTheEnginesLogits) {
  const model::ModelConfig c = small_gpt2();
  model::Gpt gpt(c, core::cpu_backend());
  randomize(gpt, 11);
  const fs::path dir = work_dir("export");
  model::save_hf_gpt2(gpt, (dir / "model").string());

  // The module's logits at every position of three rows.
  const int B = 3, T = c.seq_len;
  core::Rng rng(5);
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  std::ofstream tf(dir / "tokens.txt");
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      tokens[b * T + t] = static_cast<int32_t>(rng.next_u64() % c.vocab_size);
      tf << tokens[b * T + t] << (t + 1 < T ? " " : "\n");
    }
  }
  tf.close();
  const std::string cmd =
      reference("logits --model " + (dir / "model").string() + " --tokens " +
                (dir / "tokens.txt").string() + " --out " + (dir / "logits.f32").string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::vector<float> ref(static_cast<size_t>(B) * T * c.vocab_size);
  std::ifstream lf(dir / "logits.f32", std::ios::binary);
  lf.read(reinterpret_cast<char*>(ref.data()), static_cast<std::streamsize>(ref.size() * 4));
  ASSERT_TRUE(lf.good()) << "short logits file";

  // The engine's: the last position of each prefix.
  double worst = 0, scale = 0;
  for (int t = 1; t <= T; ++t) {
    std::vector<int32_t> prefix;
    for (int b = 0; b < B; ++b)
      prefix.insert(prefix.end(), tokens.begin() + b * T, tokens.begin() + b * T + t);
    const std::vector<float> got = gpt.last_logits(prefix.data(), B, t);
    ASSERT_EQ(got.size(), static_cast<size_t>(B) * c.vocab_size);
    for (int b = 0; b < B; ++b) {
      for (int v = 0; v < c.vocab_size; ++v) {
        const double r = ref[(static_cast<size_t>(b) * T + t - 1) * c.vocab_size + v];
        worst = std::max(worst, std::abs(got[static_cast<size_t>(b) * c.vocab_size + v] - r));
        scale = std::max(scale, std::abs(r));
      }
    }
  }
  EXPECT_LT(worst, 1e-5) << "largest logit difference " << worst << " (logits up to " << scale
                         << ")";
  EXPECT_GT(scale, 0.1);
  std::printf("engine vs Hugging Face module: largest logit difference %.3g (logits up to %.3g)\n",
              worst, scale);
}

TEST(HfGpt2, ImportOfTheModulesWeightsExportsBitExact) {
  const model::ModelConfig c = small_gpt2();
  const fs::path dir = work_dir("import");
  const std::string cmd = reference("random --out " + (dir / "hf").string() +
                                    " --n_layer 2 --n_head 4 --n_embd 32 --n_positions 12 "
                                    "--vocab_size 50257 --seed 3");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_TRUE(model::is_hf_gpt2_dir((dir / "hf").string()));
  const auto weights = model::read_hf_gpt2((dir / "hf").string(), c);
  model::Gpt gpt(c, core::cpu_backend());
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    const core::Tensor& host = weights.at(gpt.table()[i].name);
    gpt.backend().copy_from_host(gpt.param(i).raw_data(), host.raw_data(), host.nbytes());
  }
  model::save_hf_gpt2(gpt, (dir / "again").string());

  core::SafetensorsReader original((dir / "hf" / "model.safetensors").string());
  core::SafetensorsReader again((dir / "again" / "model.safetensors").string());
  EXPECT_EQ(again.metadata().at("format"), "pt");
  size_t compared = 0;
  for (const core::StTensorInfo& info : original.tensors()) {
    if (info.name.ends_with(".attn.bias") && info.shape.size() == 4) continue;  // mask buffer
    const std::string key = "transformer." + info.name;
    ASSERT_TRUE(again.contains(key)) << key;
    EXPECT_EQ(again.info(key).shape, info.shape) << key;
    EXPECT_TRUE(again.read_bytes(key) == original.read_bytes(info.name)) << key << " differs";
    ++compared;
  }
  EXPECT_EQ(compared, again.tensors().size());
  EXPECT_EQ(compared, 4u + 12u * 2u);  // wte, wpe, ln_f (2) + 12 per block
}

// A checkpoint stored in half precision (many on the Hub are) imports as the floats it stands
// for: BF16 exactly as the f32 weights rounded to bf16 (torch and the engine both round to
// nearest, ties to even), F16 within its unit roundoff 2^-11 (2^-25 absolute below its smallest
// normal).
TEST(HfGpt2, Bf16AndF16CheckpointsImportConverted) {
  const model::ModelConfig c = small_gpt2();
  const fs::path dir = work_dir("half");
  for (const char* dtype : {"F32", "BF16", "F16"}) {
    const std::string cmd = reference("random --out " + (dir / dtype).string() +
                                      " --n_layer 2 --n_head 4 --n_embd 32 --n_positions 12 "
                                      "--vocab_size 50257 --seed 5 --dtype " +
                                      dtype);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  }
  EXPECT_EQ(core::SafetensorsReader((dir / "BF16" / "model.safetensors").string())
                .info("wte.weight")
                .dtype,
            core::StDType::BF16);
  const auto f32 = model::read_hf_gpt2((dir / "F32").string(), c);
  const auto b16 = model::read_hf_gpt2((dir / "BF16").string(), c);
  const auto f16 = model::read_hf_gpt2((dir / "F16").string(), c);
  double worst_f16 = 0;
  for (const auto& [name, t] : f32) {
    EXPECT_EQ(b16.at(name).dtype(), core::DType::F32);
    EXPECT_EQ(b16.at(name).to_vector(), t.to(core::DType::BF16).to_vector()) << name;
    const std::vector<float> want = t.to_vector(), got = f16.at(name).to_vector();
    for (size_t i = 0; i < want.size(); ++i) {
      const double err = std::fabs(double(got[i]) - want[i]);
      ASSERT_LE(err, 0x1p-11 * std::fabs(want[i]) + 0x1p-25) << name << " " << i;
      worst_f16 = std::max(worst_f16, err / (0x1p-11 * std::fabs(want[i]) + 0x1p-25));
    }
  }
  std::printf("[ measured ] F16 import: at most %.3g of the unit-roundoff bar\n", worst_f16);
}

TEST(HfGpt2, RefusesWhatHasNoCounterpartOrDoesNotFit) {
  model::ModelConfig modern = small_gpt2();
  modern.arch = model::Arch::Modern;
  model::Gpt gpt(modern, core::cpu_backend());
  const fs::path dir = work_dir("refuse");
  try {
    model::save_hf_gpt2(gpt, (dir / "m").string());
    ADD_FAILURE() << "a modern model has no Hugging Face GPT-2 counterpart";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("arch 'modern' (rotary positions, RMSNorm"),
              std::string::npos)
        << e.what();
  }
  // The record recipe's parameters are refused by name.
  model::ModelConfig recipe = modern;
  recipe.value_embeds = 1;
  EXPECT_NE(model::hf_gpt2_incompatibility(recipe).find("value_embeds.*.weight"),
            std::string::npos);
  recipe = modern;
  recipe.unet_skips = true;
  EXPECT_NE(model::hf_gpt2_incompatibility(recipe).find("skip_weights"), std::string::npos);
  recipe = modern;
  recipe.x0_lambdas = true;
  EXPECT_NE(model::hf_gpt2_incompatibility(recipe).find("blocks.*.lambdas"), std::string::npos);
  recipe = modern;
  recipe.no_attn_layers = {0};
  EXPECT_NE(model::hf_gpt2_incompatibility(recipe).find("no_attn_layers"), std::string::npos);
  model::ModelConfig moe = small_gpt2();
  moe.moe_experts = 4;
  EXPECT_NE(model::hf_gpt2_incompatibility(moe).find("mixture-of-experts"), std::string::npos);

  const std::string cmd = reference("random --out " + (dir / "hf").string() +
                                    " --n_layer 2 --n_head 4 --n_embd 32 --n_positions 12 "
                                    "--vocab_size 50257");
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  model::ModelConfig deeper = small_gpt2();
  deeper.n_layer = 3;
  try {
    model::read_hf_gpt2((dir / "hf").string(), deeper);
    ADD_FAILURE() << "n_layer mismatch accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_layer is 2, the model config has model.n_layer 3"),
              std::string::npos)
        << e.what();
  }
  model::ModelConfig longer = small_gpt2();
  longer.seq_len = 16;
  try {
    model::read_hf_gpt2((dir / "hf").string(), longer);
    ADD_FAILURE() << "seq_len beyond n_positions accepted";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find("n_positions is 12, below the model config's "
                                         "model.seq_len 16"),
              std::string::npos)
        << e.what();
  }
  // A shorter context takes the first positions.
  model::ModelConfig shorter = small_gpt2();
  shorter.seq_len = 8;
  const auto w = model::read_hf_gpt2((dir / "hf").string(), shorter);
  EXPECT_EQ(w.at("pos_embed.weight").shape(), (core::Shape{8, 32}));
}

// The file's tensors plus `extra`, written over it.
void rewrite_with(const fs::path& file, const std::map<std::string, core::Tensor>& extra) {
  const core::SafetensorsContents contents = core::load_safetensors(file.string());
  core::SafetensorsWriter writer;
  for (const auto& [k, v] : contents.metadata)
    writer.set_metadata(k, v);
  for (const auto& [name, t] : contents.tensors)
    writer.add(name, t);
  for (const auto& [name, t] : extra)
    writer.add(name, t);
  writer.write(file.string());
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Whatever the model has no place for used to be dropped without a word, so the model loaded was
// not the file's: extra tensors and an untied head (an lm_head.weight other than wte) are refused
// naming them; the attention-mask buffers of old files and a head saved as a copy of wte pass.
TEST(HfGpt2, ExtraTensorsAndAnUntiedHeadAreRefused) {
  model::ModelConfig c = small_gpt2();
  c.vocab_size = 256;
  model::Gpt gpt(c, core::cpu_backend());
  randomize(gpt, 5);
  const fs::path dir = work_dir("extra");
  model::save_hf_gpt2(gpt, (dir / "m").string());
  const fs::path file = dir / "m" / "model.safetensors";
  const core::Tensor wte = core::SafetensorsReader(file.string()).read("transformer.wte.weight");

  rewrite_with(file, {{"transformer.h.0.attn.bias", core::Tensor::zeros({1, 1, 12, 12})},
                      {"lm_head.weight", wte.clone()}});
  EXPECT_NO_THROW(model::read_hf_gpt2((dir / "m").string(), c));

  core::Tensor untied = wte.clone();
  untied.data<float>()[7] += 0.5f;
  model::save_hf_gpt2(gpt, (dir / "m").string());
  rewrite_with(file, {{"lm_head.weight", untied}});
  std::string msg = test_util::error_of([&] { model::read_hf_gpt2((dir / "m").string(), c); });
  EXPECT_NE(msg.find("tensor 'lm_head.weight' differs from wte in 1 of 8192 values: an untied "
                     "head"),
            std::string::npos)
      << msg;

  model::save_hf_gpt2(gpt, (dir / "m").string());
  rewrite_with(file, {{"transformer.h.2.mlp.c_fc.weight", core::Tensor::zeros({32, 128})},
                      {"score.weight", core::Tensor::zeros({2, 32})}});
  msg = test_util::error_of([&] { model::read_hf_gpt2((dir / "m").string(), c); });
  EXPECT_NE(msg.find(file.string() + ": 2 tensor(s) that are no parameter of this GPT-2 model "
                                     "('score.weight', 'transformer.h.2.mlp.c_fc.weight')"),
            std::string::npos)
      << msg;
}

// The file with the first `from` of its safetensors header replaced by `to` (the same length, so
// the header length still holds).
void patch_header(const fs::path& file, const std::string& from, const std::string& to) {
  std::string bytes = read_text(file);
  const size_t at = bytes.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  bytes.replace(at, from.size(), to);
  std::ofstream(file, std::ios::binary) << bytes;
}

// Hostile Hugging Face folders, as downloaded or sent: each refused in one line naming the file
// and what is wrong, before any allocation sized by the file's numbers.
TEST(HfGpt2, HostileFoldersAreRefusedInOneLine) {
  model::ModelConfig c = small_gpt2();
  c.vocab_size = 256;
  model::Gpt gpt(c, core::cpu_backend());
  const fs::path dir = work_dir("hostile");
  const fs::path good = dir / "good";
  model::save_hf_gpt2(gpt, good.string());
  const std::string config_json = read_text(good / "config.json");
  const auto with_config = [&](const std::string& key, const std::string& value) {
    std::string text = config_json;
    const size_t at = text.find("\"" + key + "\": ");
    const size_t end = text.find_first_of(",\n}", at);
    text.replace(at, end - at, "\"" + key + "\": " + value);
    return text;
  };
  struct Case {
    const char* name;
    std::function<void(const fs::path&)> make;  // spoils a copy of the good folder
    std::string expected;                       // after the path of the folder
  };
  const auto write = [](const std::string& text) {
    return [text](const fs::path& d) { std::ofstream(d / "config.json") << text; };
  };
  const std::vector<Case> cases = {
      {"zero layers", write(with_config("n_layer", "0")),
       "/config.json: n_layer is 0, the model config has model.n_layer 2"},
      {"negative width", write(with_config("n_embd", "-32")),
       "/config.json: n_embd is -32, the model config has model.d_model 32"},
      {"enormous width", write(with_config("n_embd", "1e300")),
       "/config.json: n_embd must be a 64-bit integer"},
      {"heads do not divide the width", write(with_config("n_head", "5")),
       "/config.json: n_head is 5, the model config has model.n_head 4"},
      {"enormous positions", write(with_config("n_positions", "9223372036854775807")),
       "tensor 'transformer.wpe.weight' has shape [12, 32], the model (pos_embed.weight) expects "
       "[9223372036854775807, 32]"},
      {"empty config.json", write(""), "/config.json"},
      {"config.json not JSON", write("{\"n_layer\": 2,"), "/config.json"},
      {"enormous config.json", write(config_json + std::string(2 << 20, ' ')),
       " bytes, more than 1048576: no model config"},
      {"config.json a FIFO",
       [](const fs::path& d) {
         fs::remove(d / "config.json");
         ASSERT_EQ(::mkfifo((d / "config.json").c_str(), 0600), 0);
       },
       "/config.json is not a regular file"},
      {"weights a link to a device",
       [](const fs::path& d) {
         fs::remove(d / "model.safetensors");
         fs::create_symlink("/dev/zero", d / "model.safetensors");
       },
       "/model.safetensors is not a regular file (a link to /dev/zero)"},
      {"header length lies",
       [](const fs::path& d) {
         std::fstream f(d / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
         const uint64_t huge = 1ull << 40;
         f.write(reinterpret_cast<const char*>(&huge), 8);
       },
       "/model.safetensors: header length 1099511627776 exceeds the limit"},
      {"offsets lie (file cut short)",
       [](const fs::path& d) {
         fs::resize_file(d / "model.safetensors", fs::file_size(d / "model.safetensors") - 4);
       },
       "(file truncated)"},
      {"dtype size does not match the bytes",
       [](const fs::path& d) { patch_header(d / "model.safetensors", "\"F32\"", "\"F16\""); },
       "bytes but F16["},
      {"dtype no float",
       [](const fs::path& d) { patch_header(d / "model.safetensors", "\"F32\"", "\"I32\""); },
       "has dtype I32, expected F32, BF16 or F16"},
      {"shape disagrees with the config",
       [](const fs::path& d) {
         patch_header(d / "model.safetensors", "\"shape\":[12,32]", "\"shape\":[32,12]");
       },
       "tensor 'transformer.wpe.weight' has shape [32, 12], the model (pos_embed.weight) expects "
       "[12, 32]"},
      // Keys that change the network: they were ignored, and another function loaded.
      {"exact GELU", write(with_config("activation_function", "\"gelu\"")),
       "/config.json: activation_function is \"gelu\", but the engine's GPT-2 computes GELU in "
       "its tanh form (gelu_new, gelu_pytorch_tanh or gelu_fast): the model loaded would not be "
       "the file's"},
      {"ReLU", write(with_config("activation_function", "\"relu\"")),
       "activation_function is \"relu\""},
      {"another LayerNorm eps", write(with_config("layer_norm_epsilon", "1e-6")),
       "/config.json: layer_norm_epsilon is 1e-6, but the engine's GPT-2 computes 1e-05"},
      {"unscaled attention", write(with_config("scale_attn_weights", "false")),
       "/config.json: scale_attn_weights is false"},
      {"attention scaled by the layer index",
       write(with_config("scale_attn_weights", "true, \"scale_attn_by_inverse_layer_idx\": true")),
       "/config.json: scale_attn_by_inverse_layer_idx is true"},
      {"untied head", write(with_config("tie_word_embeddings", "false")),
       "/config.json: tie_word_embeddings is false, but the engine's GPT-2 computes a head tied "
       "to wte"},
      {"another MLP width", write(with_config("n_inner", "64")),
       "/config.json: n_inner is 64, but the engine's GPT-2 computes an MLP 4 x n_embd = 128 wide"},
  };
  for (const Case& k : cases) {
    const fs::path d = dir / "bad";
    fs::remove_all(d);
    fs::copy(good, d);
    k.make(d);
    const std::string msg = test_util::error_of([&] { model::read_hf_gpt2(d.string(), c); });
    EXPECT_NE(msg.find(d.string()), std::string::npos) << k.name << ": " << msg.substr(0, 400);
    EXPECT_NE(msg.find(k.expected), std::string::npos) << k.name << ": " << msg.substr(0, 400);
    EXPECT_EQ(msg.find('\n'), std::string::npos) << k.name << ": " << msg.substr(0, 400);
  }

  // A weights file that links out of the folder loads (the download cache's snapshot folders
  // are links into its blobs), and the origin names where the weights were read from.
  const fs::path linked = dir / "linked";
  fs::copy(good, linked);
  fs::rename(linked / "model.safetensors", dir / "blob");
  fs::create_symlink(dir / "blob", linked / "model.safetensors");
  EXPECT_NO_THROW(model::read_hf_gpt2(linked.string(), c));
  // The values that are the engine's network load: the other names of the tanh GELU, n_inner
  // given as 4 x n_embd, and a folder without these keys (transformers' defaults).
  std::string same = with_config("activation_function", "\"gelu_pytorch_tanh\"");
  same.replace(same.find("\"n_inner\": null"), 15, "\"n_inner\": 128");
  std::ofstream(linked / "config.json") << same;
  EXPECT_NO_THROW(model::read_hf_gpt2(linked.string(), c));
  std::string bare = config_json;
  for (const char* key : {"activation_function", "layer_norm_epsilon", "scale_attn_weights",
                          "tie_word_embeddings", "n_inner"}) {
    const size_t at = bare.find(std::string("  \"") + key);
    bare.erase(at, bare.find('\n', at) + 1 - at);
  }
  std::ofstream(linked / "config.json") << bare;
  EXPECT_NO_THROW(model::read_hf_gpt2(linked.string(), c));
  EXPECT_EQ(model::hf_gpt2_weights_origin(linked.string()),
            (linked / "model.safetensors").string() + " (a link to " +
                fs::canonical(dir / "blob").string() + ", outside the folder)");
  EXPECT_EQ(model::hf_gpt2_weights_origin(good.string()), (good / "model.safetensors").string());
}

// GPT-2's <|endoftext|> (50256) is bos and eos only where the vocabulary holds it: a 256-token
// model exported "bos_token_id": 50256, an id past its embedding.
TEST(HfGpt2, ExportedConfigNamesEndOfTextOnlyInsideTheVocabulary) {
  model::ModelConfig c = small_gpt2();
  c.vocab_size = 256;
  const fs::path dir = work_dir("bos");
  model::save_hf_gpt2(model::Gpt(c, core::cpu_backend()), (dir / "small").string());
  std::string json = read_text(dir / "small" / "config.json");
  EXPECT_NE(json.find("\"bos_token_id\": null,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"eos_token_id\": null,"), std::string::npos) << json;
  model::save_hf_gpt2(model::Gpt(small_gpt2(), core::cpu_backend()), (dir / "full").string());
  json = read_text(dir / "full" / "config.json");
  EXPECT_NE(json.find("\"bos_token_id\": 50256,"), std::string::npos) << json;
  EXPECT_NE(json.find("\"eos_token_id\": 50256,"), std::string::npos) << json;
}

// The exported config.json once went through the fixed name config.json.tmp, following a link
// planted there into the file it named (overwritten with the config).
TEST(HfGpt2, ExportWritesNoFileThroughALinkAtATemporaryName) {
  const fs::path dir = work_dir("tmp_link");
  const fs::path victim = dir / "victim.txt";
  { std::ofstream(victim) << "keep me"; }
  fs::create_directories(dir / "out");
  fs::create_symlink(victim, dir / "out" / "config.json.tmp");
  model::save_hf_gpt2(model::Gpt(small_gpt2(), core::cpu_backend()), (dir / "out").string());
  EXPECT_EQ(read_text(victim), "keep me");
  EXPECT_NE(read_text(dir / "out" / "config.json").find("\"n_layer\": 2"), std::string::npos);
  EXPECT_FALSE(fs::is_symlink(dir / "out" / "config.json"));
}

}  // namespace
