// What a resume must agree on with its checkpoint beyond the tensors: here, the data. The
// fingerprint covers the shards' token counts; the content hashes catch a shard whose tokens
// changed at the same count (re-tokenised, edited, replaced by another file of the same size).
#include "engine/checkpoint/resume_check.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/data_loader.h"
#include "data/document_loader.h"
#include "data/token_shard.h"
#include "tests/test_util.h"

namespace {

namespace fs = std::filesystem;
using test_util::error_of;

std::vector<uint16_t> tokens(int64_t n, uint16_t first) {
  std::vector<uint16_t> t(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    t[static_cast<size_t>(i)] = static_cast<uint16_t>((first + 7 * i) % 256);
  return t;
}

data::LoaderOptions options(const std::string& dir) {
  data::LoaderOptions o;
  o.pattern = dir + "/shard_*.bin";
  o.seq_len = 16;
  o.batch_rows = 4;
  o.vocab_size = 256;
  return o;
}

TEST(ResumeCheck, ShardWhoseTokensChangedAtTheSameCountIsNamed) {
  const std::string dir = (fs::temp_directory_path() / "engine_resume_content").string();
  fs::remove_all(dir);
  fs::create_directories(dir);
  data::write_shard(dir + "/shard_000.bin", tokens(1000, 1));
  data::write_shard(dir + "/shard_001.bin", tokens(1000, 2));
  engine::Manifest m;
  engine::record_data_state(m, data::DataLoader(options(dir)));
  EXPECT_NO_THROW(engine::check_same_data("ckpt", m, data::DataLoader(options(dir))));

  // Same size, one token different: the counts (and so the fingerprint) agree.
  std::vector<uint16_t> edited = tokens(1000, 2);
  edited[500] = static_cast<uint16_t>((edited[500] + 1) % 256);
  data::write_shard(dir + "/shard_001.bin", edited);
  const std::string msg =
      error_of([&] { engine::check_same_data("ckpt", m, data::DataLoader(options(dir))); });
  EXPECT_NE(msg.find("cannot resume from ckpt: the tokens of '" + dir +
                     "/shard_001.bin' changed since it was written (same token count, other "
                     "tokens; 1 of 2 shard(s)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("train.init_from=ckpt"), std::string::npos) << msg;

  // A checkpoint written before the hashes were recorded still resumes.
  m.state.erase("data.content");
  EXPECT_NO_THROW(engine::check_same_data("ckpt", m, data::DataLoader(options(dir))));
  fs::remove_all(dir);
}

// train.stages: the document loader's order keys go into the manifest; a resume with other stages
// is refused naming both stage lists.
TEST(ResumeCheck, DocumentLoaderWithOtherStagesIsRefusedNamingThem) {
  const std::string dir = (fs::temp_directory_path() / "engine_resume_stages").string();
  fs::create_directories(dir);
  data::write_shard(dir + "/shard_000.bin", tokens(2000, 3));
  auto loader = [&](int64_t max_doc) {
    data::DocumentLoaderOptions o;
    o.pattern = dir + "/shard_*.bin";
    o.stages = {{0, 16, 2, max_doc, 8}, {5, 32, 2, 32, 8}};
    o.vocab_size = 256;
    o.bos = 3;
    return data::DocumentLoader(o);
  };
  engine::Manifest m;
  engine::record_data_state(m, loader(12));
  EXPECT_EQ(m.state.at("data.bos"), "3");
  EXPECT_NO_THROW(engine::check_same_data("ckpt", m, loader(12)));
  const std::string msg = error_of([&] { engine::check_same_data("ckpt", m, loader(10)); });
  EXPECT_NE(msg.find("stages from step 0 2 rows of 16, documents to 12, cap 8; from step 5"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("this run reads 1 shard(s) of 2000 tokens ('" + dir +
                     "/shard_*.bin'), documents from BOS 3, stages from step 0 2 rows of 16, "
                     "documents to 10"),
            std::string::npos)
      << msg;
  fs::remove_all(dir);
}

}  // namespace
