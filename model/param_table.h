// The parameter table: every parameter of the GPT with its name (the names checkpoints and
// optimizer globs use: "embed.weight", "blocks.<l>.attn.qkv.weight", ...), shape, kind, init
// rule, layer and place in the flat buffer. The trainer, sharding plan, optimizer groups and
// checkpoints read names only from here.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "model/model_config.h"

namespace model {

enum class ParamKind {
  Matrix,        // 2D hidden weight [out, in]
  ExpertMatrix,  // 3D stacked expert weights [E, out, in]
  Vector,        // biases and norm weights
  Embedding,     // embed.weight [Vp, D], pos_embed.weight [T, D]
  Head,          // lm_head.weight [Vp, D] (untied only)
};

// Uniform: U(-sqrt(3) stddev, sqrt(3) stddev), the record's hidden-matrix init.
enum class InitRule { Normal, Uniform, Zero, One, Values };

struct ParamInfo {
  std::string name;
  core::Shape shape;
  ParamKind kind = ParamKind::Matrix;
  InitRule init = InitRule::Normal;
  float stddev = 0.0f;        // for InitRule::Normal and Uniform
  std::vector<float> values;  // for InitRule::Values: one per element
  int layer = -1;             // block index; -1 the embeddings, n_layer the final norm and head
  int64_t offset = 0;         // element offset in the flat parameter (and gradient) buffer
  int64_t numel = 0;
  // Rows at and beyond this index are vocabulary padding (zero at init, zero gradient);
  // -1 when the parameter has no padding.
  int64_t valid_rows = -1;
};

class ParamTable {
 public:
  explicit ParamTable(const ModelConfig& config);

  const std::vector<ParamInfo>& params() const { return params_; }
  size_t size() const { return params_.size(); }
  const ParamInfo& operator[](size_t i) const { return params_[i]; }
  int64_t total_numel() const { return total_numel_; }
  // Index of a parameter by name; nullopt when absent.
  std::optional<size_t> find(const std::string& name) const;
  // As find, but throws core::Error naming the missing parameter.
  const ParamInfo& at(const std::string& name) const;

  // Fills `dst` (host f32, contiguous) with elements [first, first + dst.numel()) of parameter i
  // at initialisation. One counter-based stream per parameter, derived from (seed, i), so a shard
  // gets exactly the values the whole tensor would hold there.
  void init_host(size_t i, const core::Tensor& dst, uint64_t seed, int64_t first = 0) const;

 private:
  void add(std::string name, core::Shape shape, ParamKind kind, InitRule init, float stddev,
           int layer, int64_t valid_rows = -1);
  // A small vector parameter with fixed initial values (the recipe's learned scalars).
  void add_values(std::string name, std::vector<float> values, int layer);

  std::vector<ParamInfo> params_;
  int64_t total_numel_ = 0;
};

}  // namespace model
