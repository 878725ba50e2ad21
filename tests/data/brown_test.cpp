// The prepared Brown data set (scripts/prepare_data.sh, run by the ctest fixture
// data_prepare_brown): every split loads, holds its documented number of documents, the genre
// splits partition the whole corpus, and the text decodes to the corpus' first sentence.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "data/data_loader.h"
#include "data/gpt2_tokenizer.h"
#include "data/shard_set.h"
#include "data/token_shard.h"
#include "data/val_loader.h"

namespace {

const std::string kData = std::string(ENGINE_REPO_ROOT) + "/data";

// All tokens of a split (its shards in order), every id checked < 50257.
std::vector<uint16_t> split_tokens(const std::string& name, const std::string& part) {
  std::vector<uint16_t> all;
  for (const std::string& f :
       data::glob_files(kData + "/" + name + "/" + name + "_" + part + "_*.bin")) {
    const auto t = data::read_shard(f, 50257);
    all.insert(all.end(), t.begin(), t.end());
  }
  return all;
}

int64_t documents(const std::vector<uint16_t>& tokens) {
  return std::count(tokens.begin(), tokens.end(), data::Gpt2Tokenizer::kEndOfText);
}

TEST(BrownData, SplitsHoldTheDocumentedDocuments) {
  struct Split {
    const char* name;
    int64_t train_docs, val_docs;
  };
  // Validation = every 10th document in sorted file order: 50 of 500, 37 of 374 informative
  // (categories a-j), 13 of 126 imaginative (k-r).
  const Split splits[] = {
      {"brown", 450, 50}, {"brown_informative", 337, 37}, {"brown_imaginative", 113, 13}};
  int64_t tokens[3][2] = {};
  for (int s = 0; s < 3; ++s) {
    const auto train = split_tokens(splits[s].name, "train");
    const auto val = split_tokens(splits[s].name, "val");
    ASSERT_FALSE(train.empty());
    ASSERT_FALSE(val.empty());
    EXPECT_EQ(train.front(), data::Gpt2Tokenizer::kEndOfText);
    EXPECT_EQ(documents(train), splits[s].train_docs) << splits[s].name;
    EXPECT_EQ(documents(val), splits[s].val_docs) << splits[s].name;
    tokens[s][0] = static_cast<int64_t>(train.size());
    tokens[s][1] = static_cast<int64_t>(val.size());
  }
  // The genre splits partition the corpus document by document.
  EXPECT_EQ(tokens[1][0] + tokens[2][0], tokens[0][0]);
  EXPECT_EQ(tokens[1][1] + tokens[2][1], tokens[0][1]);
  EXPECT_GT(tokens[0][0], 1000000);  // about a million words
}

TEST(BrownData, LoadersReadItAndItDecodesToText) {
  data::LoaderOptions o;
  o.pattern = kData + "/brown/brown_train_*.bin";
  o.seq_len = 64;
  o.batch_rows = 8;
  o.shuffle = false;
  data::DataLoader train(o);
  data::Batch b;
  train.load(0, 0, b);
  data::Gpt2Tokenizer tok(kData + "/tokenizer");
  const std::string text = tok.decode(std::span<const int32_t>(b.inputs.data(), 12));
  EXPECT_EQ(text.rfind("<|endoftext|>The Fulton County Grand Jury said Friday", 0), 0u) << text;

  data::ValOptions v;
  v.pattern = kData + "/brown/brown_val_*.bin";
  v.seq_len = 64;
  v.batch_rows = 8;
  v.world = 2;
  data::ValLoader val(v);
  EXPECT_EQ(val.num_steps(), val.shards().num_sequences() / 8);
  EXPECT_GT(val.tokens(), 100000);
}

}  // namespace
