// Hugging Face GPT-2 folders: config.json and model.safetensors in one input, the text of the one,
// a line "@@model.safetensors" and the bytes of the other, written into a folder and read by
// model::read_hf_gpt2 for a small GPT-2 model.
// Lying sizes, shapes, dtypes and offsets must be refused with core::Error before anything is
// allocated from them; fuzz/make_hf_folder_seeds.py writes the seeds.
#include <filesystem>

#include "core/check.h"
#include "fuzz/fuzz_util.h"
#include "model/hf_gpt2.h"

namespace {

// The model of the seeds: 1 layer, 2 heads, width 8, 4 positions, 16 tokens.
model::ModelConfig small_gpt2() {
  model::ModelConfig c;
  c.arch = model::Arch::Gpt2;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 8;
  c.seq_len = 4;
  c.vocab_size = 16;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::filesystem::path dir = fuzz::scratch() / "hf";
  std::filesystem::create_directories(dir);
  fuzz::write_two_files(data, size, "\n@@model.safetensors\n", "hf/config.json",
                        "hf/model.safetensors");
  try {
    (void)model::read_hf_gpt2(dir.string(), small_gpt2());
  } catch (const core::Error&) {
  }
  return 0;
}
