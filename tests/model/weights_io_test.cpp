#include "model/weights_io.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>

#include "core/check.h"
#include "core/safetensors.h"

namespace {

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 8;
  c.seq_len = 4;
  c.vocab_size = 40;
  c.moe_experts = 2;
  c.moe_top_k = 1;
  return c;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(::testing::TempDir()) / name).string();
}

void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    FAIL() << "no error; expected one mentioning '" << fragment << "'";
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(WeightsIo, RoundTripAndMetadata) {
  model::Gpt a(tiny(), core::cpu_backend());
  a.init_weights();
  const std::string path = temp_path("model_roundtrip.safetensors");
  model::save_weights(a, path);
  core::SafetensorsReader reader(path);
  EXPECT_EQ(reader.metadata_value("model.arch"), "modern");
  EXPECT_EQ(reader.metadata_value("model.moe.experts"), "2");
  EXPECT_EQ(reader.info("blocks.0.moe.fc.weight").shape, (core::Shape{2, 32, 8}));
  auto c = tiny();
  c.seed = 99;
  model::Gpt b(c, core::cpu_backend());
  b.init_weights();
  EXPECT_NE(a.params().to_vector(), b.params().to_vector());
  model::load_weights(b, path);
  EXPECT_EQ(a.params().to_vector(), b.params().to_vector());
}

TEST(WeightsIo, RefusesMismatchedFilesNamingTheTensor) {
  model::Gpt gpt(tiny(), core::cpu_backend());
  gpt.init_weights();
  const std::string path = temp_path("model_bad.safetensors");
  auto write_with = [&](const std::string& skip, const std::string& extra, bool wrong_shape) {
    core::SafetensorsWriter w;
    for (size_t i = 0; i < gpt.table().size(); ++i) {
      const auto& p = gpt.table()[i];
      if (p.name == skip) continue;
      core::Tensor t = gpt.param(i).clone();
      if (wrong_shape && p.name == "blocks.0.attn.qkv.weight") t = t.view({8, 24});
      w.add(p.name, t);
    }
    if (!extra.empty()) w.add(extra, core::Tensor::zeros({2}));
    w.write(path);
  };
  write_with("blocks.0.moe.router.weight", "", false);
  expect_error([&] { model::load_weights(gpt, path); }, "'blocks.0.moe.router.weight' is missing");
  write_with("", "blocks.0.mlp.fc.weight", false);
  expect_error([&] { model::load_weights(gpt, path); }, "'blocks.0.mlp.fc.weight' is not a");
  write_with("", "", true);
  expect_error([&] { model::load_weights(gpt, path); }, "'blocks.0.attn.qkv.weight' has shape");
  core::SafetensorsWriter w;
  for (size_t i = 0; i < gpt.table().size(); ++i) {
    const auto& p = gpt.table()[i];
    if (p.name == "lm_head.weight") {
      w.add_bytes(p.name, core::StDType::F64, p.shape, std::vector<std::byte>(p.numel * 8));
    } else {
      w.add(p.name, gpt.param(i).clone());
    }
  }
  w.write(path);
  expect_error([&] { model::load_weights(gpt, path); },
               "tensor \"lm_head.weight\" has dtype F64, expected F32, BF16 or F16");
}

// Weights stored in bf16 (a half-precision export) load as the floats they stand for.
TEST(WeightsIo, Bf16FilesLoadConverted) {
  model::Gpt a(tiny(), core::cpu_backend());
  a.init_weights();
  const std::string path = temp_path("model_bf16.safetensors");
  core::SafetensorsWriter w;
  for (size_t i = 0; i < a.table().size(); ++i)
    w.add(a.table()[i].name, a.param(i).to(core::DType::BF16));
  w.write(path);
  EXPECT_EQ(core::SafetensorsReader(path).info("embed.weight").dtype, core::StDType::BF16);
  auto c = tiny();
  c.seed = 99;
  model::Gpt b(c, core::cpu_backend());
  b.init_weights();
  model::load_weights(b, path);
  for (size_t i = 0; i < a.table().size(); ++i)
    EXPECT_EQ(b.param(i).to_vector(), a.param(i).to(core::DType::BF16).to_vector())
        << a.table()[i].name;
}

}  // namespace
