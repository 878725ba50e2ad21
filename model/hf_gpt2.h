// GPT-2 in Hugging Face's layout (transformers' GPT2LMHeadModel). The engine's gpt2 arch is the
// same network (docs/specs/model.md), so export and import are a renaming and three layout
// changes:
//   - names: embed.weight <-> transformer.wte.weight, pos_embed.weight <-> transformer.wpe.weight,
//     blocks.{i}.ln1 <-> transformer.h.{i}.ln_1, attn.qkv <-> attn.c_attn, attn.proj <->
//     attn.c_proj, ln2 <-> ln_2, mlp.fc <-> mlp.c_fc, mlp.proj <-> mlp.c_proj, ln_f <->
//     transformer.ln_f;
//   - Conv1D: Hugging Face stores a linear layer's weight [in, out] (y = x W + b), the engine
//     [out, in] (y = x W^T + b), so every matrix is transposed;
//   - vocabulary: the engine pads embed.weight to a multiple of 64 rows, GPT-2 has vocab_size.
// The head is tied to wte, so no lm_head.weight is written (from_pretrained ties it).
#pragma once

#include <map>
#include <string>

#include "core/tensor.h"
#include "model/gpt.h"

namespace model {

// Why `config` has no Hugging Face GPT-2 counterpart, or "" when it has one.
std::string hf_gpt2_incompatibility(const ModelConfig& config);

// Writes DIR/config.json and DIR/model.safetensors (F32, metadata format: pt), so that
// GPT2LMHeadModel.from_pretrained(DIR) loads the model. bos_token_id and eos_token_id are
// <|endoftext|> (50256) when the vocabulary holds it, else null. Throws for a model without
// counterpart.
void save_hf_gpt2(const Gpt& gpt, const std::string& dir);

// Whether `path` is a folder holding config.json and model.safetensors.
bool is_hf_gpt2_dir(const std::string& path);

// Where read_hf_gpt2 reads the weights of `dir`: DIR/model.safetensors, followed by the file it
// links to when that lies outside the folder. Links are followed (the Hugging Face download
// cache's snapshot folders are links into its blobs folder), so a log line says where the
// weights came from.
std::string hf_gpt2_weights_origin(const std::string& dir);

// The engine's parameters (host F32, the table's names and shapes) from a Hugging Face GPT-2
// folder, for a model of `config`. config.json must agree with it (model_type gpt2, n_layer,
// n_head, n_embd, vocab_size, n_positions >= seq_len: the first seq_len positions are taken);
// every tensor must be present with its shape (keys with or without the "transformer." prefix;
// the attention mask buffers of old files are skipped), and nothing else may be: a tensor the
// model has no place for, or an lm_head.weight that is not wte (an untied head), is refused,
// since the model loaded would not be the file's. config.json (at most 1 MiB) and
// model.safetensors must be regular files, links followed. Errors name the file and the tensor.
std::map<std::string, core::Tensor> read_hf_gpt2(const std::string& dir, const ModelConfig& config);

}  // namespace model
