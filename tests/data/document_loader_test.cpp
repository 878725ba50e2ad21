// The BOS-aligned document loader and the bigram hash against an independent reading of
// modded-nanogpt record #89's generator (train_gpt.py at f411b3d3: Shard.next_batch,
// distributed_data_generator with align_to_bos, get_bigram_hash), written here from the record's
// code as it runs: whole shards in memory, a BOS index, the ranks of one call in turn, a call
// that runs out of documents restarted on the next shard.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "core/check.h"
#include "core/rng.h"
#include "data/bigram_hash.h"
#include "data/document_loader.h"
#include "data/token_shard.h"

namespace {

namespace fs = std::filesystem;
constexpr int32_t kBos = data::kDocumentBos;
constexpr int64_t kTable = 50304 * 15 / 2;  // the record's bigram_vocab_size, 377280

// int32 arithmetic as Python would evaluate it on torch int32 tensors: the exact product, then
// wrapped to [-2^31, 2^31); Python's % (floor) for torch.remainder.
int64_t wrap32(int64_t v) {
  const int64_t m = int64_t{1} << 32;
  return ((v + (int64_t{1} << 31)) % m + m) % m - (int64_t{1} << 31);
}
int64_t py_mod(int64_t a, int64_t m) {
  return ((a % m) + m) % m;
}

// get_bigram_hash: out = x; out[0] = mod; out[1:] = (r1 out[1:] ^ r2 out[:-1]) % mod, the
// right-hand side evaluated on out after out[0] was set.
std::vector<int32_t> record_bigram(const std::vector<int32_t>& x) {
  const int64_t mod = kTable - 1;
  std::vector<int64_t> out(x.begin(), x.end());
  out[0] = mod;
  std::vector<int32_t> h(x.size());
  h[0] = static_cast<int32_t>(mod);
  for (size_t t = 1; t < x.size(); ++t)
    h[t] = static_cast<int32_t>(py_mod(wrap32(36313 * out[t]) ^ wrap32(27191 * out[t - 1]), mod));
  return h;
}

// One row of the record's generator for one rank.
struct RecordRow {
  std::vector<int32_t> inputs, targets, cu_seqlens, bigram;
};

// The record's generator over in-memory shards, `world` ranks per call (the record's 8 GPUs).
class RecordGenerator {
 public:
  RecordGenerator(std::vector<std::vector<uint16_t>> shards, int world)
      : shards_(std::move(shards)), world_(world) {
    open(0);
  }
  // One call: every rank's row of num_tokens_local tokens, documents cut at max_seq_len.
  std::vector<RecordRow> next(int64_t num_tokens_local, int64_t max_seq_len, int64_t max_docs) {
    for (;;) {
      std::vector<std::vector<std::pair<int64_t, int64_t>>> docs(world_);
      if (!next_batch(num_tokens_local, max_seq_len, docs)) {  // StopIteration: next shard
        ENGINE_CHECK(file_ + 1 < static_cast<int64_t>(shards_.size()), "reference: out of shards");
        open(file_ + 1);
        continue;
      }
      std::vector<RecordRow> rows(world_);
      for (int r = 0; r < world_; ++r) {
        std::vector<int32_t> buf;
        std::vector<int64_t> ends;
        for (auto [i, j] : docs[r]) {
          for (int64_t k = i; k < j; ++k)
            buf.push_back(shards_[file_][k]);
          ends.push_back(j - i);
        }
        ends.back() -= 1;  // end_idxs[-1] -= 1
        RecordRow& row = rows[r];
        row.inputs.assign(buf.begin(), buf.end() - 1);
        row.targets.assign(buf.begin() + 1, buf.end());
        // _cum_lengths = full(max_num_docs, T); [0] = 0; [1:len+1] = cumsum: a shape error when
        // len + 1 > max_num_docs.
        ENGINE_CHECK(static_cast<int64_t>(ends.size()) + 1 <= max_docs, "reference: too many docs");
        row.cu_seqlens.assign(static_cast<size_t>(max_docs),
                              static_cast<int32_t>(num_tokens_local));
        row.cu_seqlens[0] = 0;
        int64_t sum = 0;
        for (size_t d = 0; d < ends.size(); ++d)
          row.cu_seqlens[d + 1] = static_cast<int32_t>(sum += ends[d]);
        row.bigram = record_bigram(row.inputs);
      }
      return rows;
    }
  }

 private:
  void open(int64_t file) {
    file_ = file;
    i_ = 0;
    bos_idx_.clear();
    for (size_t k = 0; k < shards_[file].size(); ++k)
      if (shards_[file][k] == kBos) bos_idx_.push_back(static_cast<int64_t>(k));
  }
  bool next_batch(int64_t T, int64_t max_seq_len,
                  std::vector<std::vector<std::pair<int64_t, int64_t>>>& docs) {
    const auto n = static_cast<int64_t>(bos_idx_.size());
    const auto size = static_cast<int64_t>(shards_[file_].size());
    int64_t idx = i_;
    for (int r = 0; r < world_; ++r) {
      int64_t cur_len = 0;
      while (cur_len <= T) {
        if (idx >= n) return false;
        const int64_t cur = bos_idx_[idx];
        idx += 1;
        const int64_t end =
            std::min({idx < n ? bos_idx_[idx] : size, cur + max_seq_len, cur + T - cur_len + 1});
        docs[r].emplace_back(cur, end);
        cur_len += end - cur;
      }
    }
    i_ = idx;
    return true;
  }

  std::vector<std::vector<uint16_t>> shards_;
  int world_;
  int64_t file_ = 0;
  int64_t i_ = 0;
  std::vector<int64_t> bos_idx_;
};

// Shards of documents that do not align with any row: each starts with BOS, then its id (a
// running count, so a served document names itself), then random tokens; lengths 2..max_len.
// Each shard begins with a few tokens before its first BOS (never read).
class DocumentLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("engine_document_loader_test_" +
            std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write_shards(const std::vector<int64_t>& docs_per_shard, int64_t max_len) {
    core::Rng rng(42);
    int64_t id = 0;
    for (size_t s = 0; s < docs_per_shard.size(); ++s) {
      std::vector<uint16_t> tokens = {7, 8, 9};
      first_doc_.push_back(id);
      for (int64_t d = 0; d < docs_per_shard[s]; ++d, ++id) {
        const int64_t len =
            2 + static_cast<int64_t>(rng.next_below(static_cast<uint64_t>(max_len - 1)));
        tokens.push_back(static_cast<uint16_t>(kBos));
        tokens.push_back(static_cast<uint16_t>(id));
        for (int64_t k = 2; k < len; ++k)
          tokens.push_back(static_cast<uint16_t>(100 + rng.next_below(50000)));
      }
      shards_.push_back(tokens);
      data::write_shard((dir_ / ("train_" + std::to_string(s) + ".bin")).string(), tokens);
    }
  }

  data::DocumentLoaderOptions options(std::vector<data::DocumentStage> stages, int rank,
                                      int world) const {
    data::DocumentLoaderOptions o;
    o.pattern = (dir_ / "train_*.bin").string();
    o.stages = std::move(stages);
    o.rank = rank;
    o.world = world;
    o.seed = 5;
    o.bigram_table_rows = kTable;
    return o;
  }

  fs::path dir_;
  std::vector<std::vector<uint16_t>> shards_;
  std::vector<int64_t> first_doc_;
};

// Two stages (rows of 32 tokens, documents cut at 12; then rows of 48, documents cut at 24),
// four rows a step; documents of 2..40 tokens over three shards, so steps cross shard ends.
const std::vector<data::DocumentStage> kStages = {{0, 32, 4, 12, 16}, {5, 48, 4, 24, 16}};
constexpr int64_t kSteps = 14;

TEST_F(DocumentLoaderTest, EveryRowIsTheRecordGeneratorsAtEveryWorldSize) {
  write_shards({60, 45, 200}, 40);
  // The record on 4 GPUs: one call a step, rank g's row is global row g.
  RecordGenerator record(shards_, 4);
  std::vector<std::vector<RecordRow>> expected;
  for (int64_t s = 0; s < kSteps; ++s) {
    const data::DocumentStage& st = s < 5 ? kStages[0] : kStages[1];
    expected.push_back(record.next(st.row_tokens, st.max_doc_tokens, st.max_docs));
  }
  int64_t rows_checked = 0;
  for (int world : {1, 2, 4}) {
    for (int rank = 0; rank < world; ++rank) {
      data::DocumentLoader loader(options(kStages, rank, world));
      for (int64_t s = 0; s < kSteps; ++s) {
        ASSERT_EQ(loader.micro_steps(s), 4 / world);
        for (int64_t m = 0; m < loader.micro_steps(s); ++m) {
          data::Batch b;
          loader.load(s, m, b);
          const RecordRow& want = expected[s][m * world + rank];
          const std::string at = "world " + std::to_string(world) + " rank " +
                                 std::to_string(rank) + " step " + std::to_string(s) + " micro " +
                                 std::to_string(m);
          ASSERT_EQ(b.rows, 1) << at;
          ASSERT_EQ(b.inputs, want.inputs) << at;
          ASSERT_EQ(b.targets, want.targets) << at;
          ASSERT_EQ(b.cu_seqlens, want.cu_seqlens) << at;
          ASSERT_EQ(b.max_docs, 16) << at;
          ASSERT_EQ(b.bigram, want.bigram) << at;
          ++rows_checked;
        }
      }
    }
  }
  EXPECT_EQ(rows_checked, 3 * kSteps * 4);
}

// Read back through the document ids: in the order of steps and rows, every document is served
// once and in order, truncated documents and the cut last one included; the only documents
// skipped are a shard's tail that could not fill a whole step, and a cut document's rest.
TEST_F(DocumentLoaderTest, RanksTakeConsecutiveDocumentsNoneTwiceNoneSkipped) {
  write_shards({60, 45, 200}, 40);
  const int world = 2;
  std::vector<int64_t> ids;      // document ids in the order served
  std::vector<int64_t> lengths;  // inputs each document got
  std::vector<int64_t>
      zero_input_after;  // ids after which a 0-input document (BOS as last target) sits
  for (int64_t s = 0; s < kSteps; ++s) {
    for (int64_t g = 0; g < 4; ++g) {
      data::DocumentLoader loader(options(kStages, static_cast<int>(g % world), world));
      data::Batch b;
      loader.load(s, g / world, b);
      const int64_t T = b.seq_len;
      for (int64_t d = 0; d + 1 < b.max_docs; ++d) {
        const int32_t begin = b.cu_seqlens[d], end = b.cu_seqlens[d + 1];
        if (begin == T) break;
        ASSERT_EQ(b.inputs[begin], kBos) << "step " << s << " row " << g << " doc " << d;
        ids.push_back(begin + 1 < T ? b.inputs[begin + 1] : b.targets[T - 1]);
        EXPECT_LE(end - begin, loader.stage_of(s).max_doc_tokens);
      }
      if (b.targets[T - 1] == kBos) zero_input_after.push_back(ids.back());
    }
  }
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), 0);
  std::set<int64_t> seen;
  int64_t shard_skips = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    EXPECT_TRUE(seen.insert(ids[k]).second) << "document " << ids[k] << " served twice";
    if (k == 0) continue;
    const int64_t a = ids[k - 1], b = ids[k];
    const bool zero_doc_between =
        std::find(zero_input_after.begin(), zero_input_after.end(), a) != zero_input_after.end();
    if (b == a + 1 || (zero_doc_between && b == a + 2)) continue;
    // Otherwise the step moved on to the next shard's first document.
    EXPECT_TRUE(std::find(first_doc_.begin(), first_doc_.end(), b) != first_doc_.end())
        << "documents " << a + 1 << ".." << b - 1 << " skipped within a shard";
    ++shard_skips;
  }
  // Both shard ends crossed: shard 0's last 3 documents could not fill a step and were skipped;
  // shard 1's last document ended a step.
  EXPECT_GE(ids.back(), first_doc_[2]);
  EXPECT_EQ(shard_skips, 1);
}

TEST_F(DocumentLoaderTest, DocumentsAreTruncatedToTheStagesLength) {
  write_shards({300}, 40);
  data::DocumentLoader loader(options({{0, 64, 1, 5, 32}}, 0, 1));
  data::Batch b;
  loader.load(0, 0, b);
  // Every document but the cut last one has min(5, its length) inputs; each starts with BOS.
  int64_t id = 0;
  for (int64_t d = 0; d + 1 < b.max_docs && b.cu_seqlens[d] < 64; ++d, ++id) {
    const int32_t begin = b.cu_seqlens[d], end = b.cu_seqlens[d + 1];
    EXPECT_EQ(b.inputs[begin], kBos);
    if (end < 64) {
      EXPECT_EQ(end - begin, 5) << "document " << id;
      EXPECT_EQ(b.inputs[begin + 1], id);
    }
  }
  EXPECT_EQ(id, 13);  // 12 documents of 5, the 13th cut at 4 (+1 target)
}

// The record's cu_seqlens hold max_docs entries: a row of max_docs - 1 documents fills them,
// one more fails naming the step and the row (the record's tensor copy fails there).
TEST_F(DocumentLoaderTest, DocumentsPerRowAreCappedAsTheRecord) {
  write_shards({400}, 3);  // documents of 2 or 3 tokens
  data::Batch b;
  // Count the documents of the first row, then cap exactly there and one below.
  data::DocumentLoader wide(options({{0, 40, 2, 40, 64}}, 0, 1));
  wide.load(0, 0, b);
  // Documents with inputs up to the first entry at T; one more when the last target is a BOS
  // (a document of 0 inputs, which cu_seqlens counts too).
  const int64_t docs =
      (std::find(b.cu_seqlens.begin(), b.cu_seqlens.end(), 40) - b.cu_seqlens.begin()) +
      (b.targets.back() == kBos ? 1 : 0);
  EXPECT_GE(docs, 14);  // documents of 2-3 tokens in a row of 41
  const std::vector<int32_t> first_row = b.inputs;
  data::DocumentLoader exact(options({{0, 40, 1, 40, docs + 1}}, 0, 1));
  exact.load(0, 0, b);
  EXPECT_EQ(b.inputs, first_row);
  EXPECT_EQ(static_cast<int64_t>(b.cu_seqlens.size()), docs + 1);
  EXPECT_EQ(b.cu_seqlens.back(), 40);
  data::DocumentLoader tight(options({{0, 40, 1, 40, docs}}, 0, 1));
  try {
    tight.load(0, 0, b);
    FAIL() << "a row over the cap was served";
  } catch (const core::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("step 0 row 0"), std::string::npos) << what;
    EXPECT_NE(what.find("packs " + std::to_string(docs) + " documents"), std::string::npos) << what;
  }
  EXPECT_EQ(data::record_max_docs(16384), 64);
  EXPECT_EQ(data::record_max_docs(32768), 96);
  EXPECT_EQ(data::record_max_docs(49152), 128);
  EXPECT_EQ(data::record_max_docs(262144), 896);  // next multiple of 128 of 873
}

// A loader restored from a state taken mid-shard (and mid-step) reads what the uninterrupted
// one reads, across the stage change and the shard ends; a state of other stages is refused.
TEST_F(DocumentLoaderTest, ResumesMidShardExactly) {
  write_shards({60, 45, 200}, 40);
  for (int rank = 0; rank < 2; ++rank) {
    data::DocumentLoader straight(options(kStages, rank, 2));
    std::vector<data::Batch> all;
    for (int64_t k = 0; k < 2 * kSteps; ++k)
      straight.next(all.emplace_back());
    data::DocumentLoader first(options(kStages, rank, 2));
    data::Batch b;
    for (int64_t k = 0; k < 3; ++k)
      first.next(b);  // stopped at step 1, micro-step 1: mid-shard, mid-step
    const data::LoaderState state = first.state();
    EXPECT_EQ(state.step, 1);
    EXPECT_EQ(state.micro_step, 1);
    data::DocumentLoader resumed(options(kStages, rank, 2));
    resumed.restore(state);
    for (int64_t k = 3; k < 2 * kSteps; ++k) {
      resumed.next(b);
      EXPECT_EQ(b.inputs, all[k].inputs) << "rank " << rank << " read " << k;
      EXPECT_EQ(b.cu_seqlens, all[k].cu_seqlens) << "rank " << rank << " read " << k;
    }
    std::vector<data::DocumentStage> other = kStages;
    other[1].max_doc_tokens = 20;
    data::DocumentLoader changed(options(other, rank, 2));
    EXPECT_THROW(changed.restore(state), core::Error);
  }
}

// The record's formula evaluated directly (int32 products that wrap, torch's floor remainder),
// and values printed by it for a row whose first product wraps too (36313 x 65535 > 2^31).
TEST(BigramHash, IsTheRecordsFormulaWithInt32Wrap) {
  const std::vector<int32_t> x = {50256, 11, 50303, 65535, 59139, 0, 50256, 123};
  std::vector<int32_t> h(x.size());
  data::bigram_hash(x, kTable, h);
  EXPECT_EQ(h, (std::vector<int32_t>{377279, 197920, 101476, 216829, 84281, 85451, 47605, 231758}));
  EXPECT_EQ(wrap32(int64_t{27191} * 377279), 1668658697);
  core::Rng rng(9);
  std::vector<int32_t> row(4096);
  for (int32_t& v : row)
    v = static_cast<int32_t>(rng.next_below(65536));
  h.resize(row.size());
  data::bigram_hash(row, kTable, h);
  EXPECT_EQ(h, record_bigram(row));
  for (int32_t v : h)
    EXPECT_TRUE(v >= 0 && v < kTable - 1 + 1);
}

}  // namespace
