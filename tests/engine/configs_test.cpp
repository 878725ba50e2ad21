// Every shipped config parses, and its optimizer groups cover its model's parameters.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/config.h"
#include "engine/model_loading.h"
#include "model/param_table.h"
#include "optim/optimizer_set.h"

namespace {

class ShippedConfig : public ::testing::TestWithParam<std::string> {};

TEST_P(ShippedConfig, ParsesAndGroupsCoverTheModel) {
  const std::string path = std::string(ENGINE_REPO_DIR) + "/configs/" + GetParam() + ".yaml";
  engine::Config c = engine::load_config(path);
  model::ParamTable table(engine::model_config_of(c));
  std::vector<comm::ParamDesc> specs;
  for (const auto& p : table.params())
    specs.push_back({p.name, p.shape});
  YAML::Node groups(YAML::NodeType::Sequence);
  for (const auto& g : c.optim)
    groups.push_back(g.node);
  optim::OptimizerSet set(groups, specs);
  size_t covered = 0;
  for (size_t g = 0; g < set.num_groups(); ++g)
    covered += set.group_params(g).size();
  EXPECT_EQ(covered, table.size());
  EXPECT_EQ(c.train.batch_tokens % c.model.seq_len, 0);
}

INSTANTIATE_TEST_SUITE_P(Configs, ShippedConfig,
                         ::testing::Values("tiny", "cpu_small", "speedrun_cpu", "gpt2_124m", "soap",
                                           "stacked_soap_moe", "osft_tiny", "osft_finetune",
                                           "osft_finetune_baseline", "torch_compare_adamw",
                                           "torch_compare_recipe"));

// docs/configuration.md carries the generated reference table; regenerate it with
// `engine config-reference` when a key changes.
TEST(ConfigReference, DocsTableIsCurrent) {
  std::ifstream in(std::string(ENGINE_REPO_DIR) + "/docs/configuration.md");
  ASSERT_TRUE(in) << "docs/configuration.md is missing";
  std::stringstream text;
  text << in.rdbuf();
  EXPECT_NE(text.str().find(engine::config_reference_markdown()), std::string::npos)
      << "docs/configuration.md's config table is stale: paste the output of `engine "
         "config-reference`";
}

}  // namespace
