#include "engine/checkpoint/resume_check.h"

#include <cinttypes>
#include <cstdio>
#include <iterator>
#include <sstream>

#include "core/check.h"
#include "data/train_loader.h"
#include "optim/glob.h"

namespace engine {

namespace {

std::string hex64(uint64_t v) {
  char buf[20];
  std::snprintf(buf, sizeof(buf), "%016" PRIx64, v);
  return buf;
}

std::string state_or(const Manifest& m, const std::string& key, const std::string& fallback) {
  auto it = m.state.find(key);
  return it == m.state.end() ? fallback : it->second;
}

// "N shard(s) of M tokens ('pattern'), seq_len T, B sequences per step, shuffle on|off": the
// loader's order keys with the values `value_of` gives (this run's, or a manifest's).
template <typename ValueOf>
std::string describe(const data::TrainLoader& loader, const std::string& shards,
                     const std::string& tokens, const std::string& pattern, ValueOf value_of) {
  std::string out = shards + " shard(s) of " + tokens + " tokens ('" + pattern + "')";
  for (const data::OrderKey& k : loader.order_keys())
    out += ", " + k.before + value_of(k) + k.after;
  return out;
}

// The optimizer name of the first group whose globs match `name` ("" when none does).
std::string optimizer_of(const std::vector<OptimGroup>& groups, const std::string& name) {
  for (const auto& g : groups)
    for (const auto& glob : g.params)
      if (optim::glob_match(glob, name)) return g.optimizer;
  return "";
}

// Every shard's token_hash in shard order, space-separated hex.
std::string content_hashes(const data::ShardSet& shards) {
  std::string out;
  for (int64_t i = 0; i < shards.num_shards(); ++i) {
    if (i > 0) out += ' ';
    out += hex64(shards.shard_hash(i));
  }
  return out;
}

}  // namespace

void record_data_state(Manifest& m, const data::TrainLoader& loader) {
  m.state["data.fingerprint"] = hex64(loader.fingerprint());
  m.state["data.pattern"] = loader.pattern();
  m.state["data.shards"] = std::to_string(loader.shards().num_shards());
  m.state["data.tokens"] = std::to_string(loader.shards().num_tokens());
  for (const data::OrderKey& k : loader.order_keys())
    m.state["data." + k.name] = k.value;
  m.state["data.content"] = content_hashes(loader.shards());
}

void check_same_data(const std::string& dir, const Manifest& m, const data::TrainLoader& loader) {
  const std::string saved = state_or(m, "data.fingerprint", "");
  if (saved.empty()) return;
  if (saved == hex64(loader.fingerprint())) {
    check_same_content(dir, m, loader.shards());
    return;
  }
  const std::string now = describe(loader, std::to_string(loader.shards().num_shards()),
                                   std::to_string(loader.shards().num_tokens()), loader.pattern(),
                                   [](const data::OrderKey& k) { return k.value; });
  const std::string then =
      describe(loader, state_or(m, "data.shards", "?"), state_or(m, "data.tokens", "?"),
               state_or(m, "data.pattern", "?"),
               [&](const data::OrderKey& k) { return state_or(m, "data." + k.name, "?"); });
  ENGINE_FAIL("cannot resume from " + dir + ": it was trained on " + then + "; this run reads " +
              now +
              ". The data order would differ from the checkpoint's (data.train, "
              "model.seq_len, train.batch_tokens, data.shuffle, data.bos and train.stages.* must "
              "stay as they were)");
}

void check_same_content(const std::string& dir, const Manifest& m, const data::ShardSet& shards) {
  const std::string saved = state_or(m, "data.content", "");
  if (saved.empty()) return;  // a checkpoint from before the content was recorded
  std::istringstream in(saved);
  std::vector<std::string> then{std::istream_iterator<std::string>(in),
                                std::istream_iterator<std::string>()};
  std::string first;
  int64_t changed = 0;
  for (int64_t i = 0; i < shards.num_shards(); ++i) {
    const bool same =
        i < static_cast<int64_t>(then.size()) && then[i] == hex64(shards.shard_hash(i));
    if (same) continue;
    if (changed++ == 0) first = shards.shard(i).path;
  }
  if (changed == 0 && then.size() == static_cast<size_t>(shards.num_shards())) return;
  ENGINE_FAIL("cannot resume from " + dir + ": the tokens of " +
              (first.empty() ? "a shard" : "'" + first + "'") +
              " changed since it was written (same token count, other tokens; " +
              std::to_string(changed) + " of " + std::to_string(shards.num_shards()) +
              " shard(s) of '" + shards.pattern() +
              "' differ): the run would not see the batches it saw. Restore the data, or start "
              "a new run from the weights (train.init_from=" +
              dir + ")");
}

void check_same_optimizers(const std::string& dir, const Manifest& m, const Config& config,
                           const std::vector<std::string>& params) {
  Config saved;
  try {
    saved = parse_config(m.config_yaml, dir + "/manifest.yaml (config)");
  } catch (const core::Error& e) {
    ENGINE_FAIL("cannot resume from " + dir + ": its saved config does not parse: " + e.what());
  }
  std::string first;
  int changed = 0;
  for (const auto& name : params) {
    const std::string before = optimizer_of(saved.optim, name);
    const std::string after = optimizer_of(config.optim, name);
    if (before == after) continue;
    if (changed++ == 0)
      first = name + " was trained with " + before + ", this run gives it " + after;
  }
  if (changed == 0) return;
  ENGINE_FAIL("cannot resume from " + dir + ": the optimizer of " + std::to_string(changed) +
              " parameter(s) changed (" + first +
              "): its state does not carry over to another optimizer. Resume with the "
              "checkpoint's optim groups, or start a new run (another checkpoint.dir)");
}

void check_same_model(const std::string& dir, const Manifest& m, const Config& config) {
  Config saved;
  try {
    saved = parse_config(m.config_yaml, dir + "/manifest.yaml (config)", {}, ConfigUse::ModelOnly);
  } catch (const core::Error& e) {
    ENGINE_FAIL("checkpoint " + dir + ": its saved config does not parse: " + e.what());
  }
  std::string changed;
  int n = 0;
  // Exempt: what only initialises or trains (zero_init_head, the MoE aux loss weight), and the
  // attention window, a condition of use rather than part of the weights' function (window_grow
  // changes it during training; a model is evaluated at another window on purpose).
  const auto exempt = [](const std::string& key) {
    return key == "model.zero_init_head" || key == "model.moe.aux_weight" ||
           key == "model.window" || key == "model.window_grow";
  };
  for (const FieldInfo& field : config_fields()) {
    if (field.key.rfind("model.", 0) != 0 || exempt(field.key)) continue;
    const std::string then = field_value_string(saved, field);
    const std::string now = field_value_string(config, field);
    if (then == now) continue;
    changed += (n++ == 0 ? "" : ", ") + field.key + " '" + then + "' there, '" + now + "' here";
  }
  ENGINE_CHECK(n == 0, "checkpoint " + dir + " holds another model than this config's (" + changed +
                           "): its weights would compute another function. Give the checkpoint's "
                           "model keys (engine eval/sample/export --checkpoint DIR take them from "
                           "it)");
}

void check_steps_left(const std::string& dir, int64_t checkpoint_step, const Config& config) {
  ENGINE_CHECK(config.train.steps >= checkpoint_step,
               "cannot resume from " + dir + ": it is at step " + std::to_string(checkpoint_step) +
                   ", beyond train.steps = " + std::to_string(config.train.steps) +
                   " (raise train.steps to train on from it)");
}

}  // namespace engine
