#include "data/document_loader.h"

#include <algorithm>
#include <limits>

#include "core/check.h"
#include "core/rng.h"
#include "data/bigram_hash.h"

namespace data {

int64_t record_max_docs(int64_t row_tokens) {
  switch (row_tokens) {
    case 16384:
      return 64;
    case 32768:
      return 96;
    case 49152:
      return 128;
    default:
      return (row_tokens / 300 + 127) / 128 * 128;  // next_multiple_of_n(T // 300, 128)
  }
}

namespace {

std::string stage_text(size_t i, const DocumentStage& s) {
  return "stage " + std::to_string(i) + " (from step " + std::to_string(s.begin_step) +
         ", rows of " + std::to_string(s.row_tokens) + ")";
}

}  // namespace

DocumentLoader::DocumentLoader(const DocumentLoaderOptions& options) : options_(options) {
  const DocumentLoaderOptions& o = options_;
  ENGINE_CHECK(o.world >= 1 && o.rank >= 0 && o.rank < o.world,
               "document loader: rank " + std::to_string(o.rank) + " is not in a world of " +
                   std::to_string(o.world));
  ENGINE_CHECK(!o.stages.empty() && o.stages[0].begin_step == 0,
               "document loader: the stages must begin with one at step 0");
  for (size_t i = 0; i < o.stages.size(); ++i) {
    const DocumentStage& s = o.stages[i];
    ENGINE_CHECK(i == 0 || s.begin_step > o.stages[i - 1].begin_step,
                 "document loader: " + stage_text(i, s) + " begins no later than the one before");
    ENGINE_CHECK(s.row_tokens > 0 && s.row_tokens < std::numeric_limits<int32_t>::max(),
                 "document loader: " + stage_text(i, s) + ": row_tokens must be in [1, 2^31-1)");
    ENGINE_CHECK(s.rows > 0 && s.rows % o.world == 0,
                 "document loader: " + stage_text(i, s) + ": " + std::to_string(s.rows) +
                     " rows per step do not divide over the world size " + std::to_string(o.world));
    ENGINE_CHECK(s.max_doc_tokens > 0,
                 "document loader: " + stage_text(i, s) + ": max_doc_tokens must be positive");
    ENGINE_CHECK(s.max_docs >= 2, "document loader: " + stage_text(i, s) +
                                      ": max_docs must be at least 2 (0 and one end)");
  }
  // seq_len 1: the set's sequences are not used here, only its checked shards and reads.
  shards_ = std::make_unique<ShardSet>(o.pattern, 1, o.vocab_size);
  bos_.resize(static_cast<size_t>(shards_->num_shards()));
  // What the order depends on, through the RNG's mixer; a tag apart from DataLoader's.
  uint64_t f = core::rng_hash(0xd0c5, static_cast<uint64_t>(o.bos));
  for (const DocumentStage& s : o.stages) {
    for (int64_t v : {s.begin_step, s.row_tokens, s.rows, s.max_doc_tokens, s.max_docs})
      f = core::rng_hash(f, static_cast<uint64_t>(v));
  }
  for (int64_t i = 0; i < shards_->num_shards(); ++i)
    f = core::rng_hash(f, static_cast<uint64_t>(shards_->shard(i).num_tokens));
  fingerprint_ = f == 0 ? 1 : f;
}

DocumentLoader::~DocumentLoader() = default;

std::vector<OrderKey> DocumentLoader::order_keys() const {
  std::string stages;
  for (const DocumentStage& s : options_.stages) {
    if (!stages.empty()) stages += "; ";
    stages += "from step " + std::to_string(s.begin_step) + " " + std::to_string(s.rows) +
              " rows of " + std::to_string(s.row_tokens) + ", documents to " +
              std::to_string(s.max_doc_tokens) + ", cap " + std::to_string(s.max_docs);
  }
  return {{"bos", std::to_string(options_.bos), "documents from BOS ", ""},
          {"stages", stages, "stages ", ""}};
}

const DocumentStage& DocumentLoader::stage_of(int64_t step) const {
  ENGINE_CHECK(step >= 0, "document loader: negative step " + std::to_string(step));
  const auto& st = options_.stages;
  const auto it =
      std::upper_bound(st.begin(), st.end(), step,
                       [](int64_t s, const DocumentStage& d) { return s < d.begin_step; });
  return *(it - 1);
}

int64_t DocumentLoader::micro_steps(int64_t step) const {
  return stage_of(step).rows / options_.world;
}

const std::vector<int64_t>& DocumentLoader::bos_index(int64_t shard) const {
  auto& slot = bos_[static_cast<size_t>(shard)];
  if (!slot) {
    auto index = std::make_unique<std::vector<int64_t>>();
    const int64_t n = shards_->shard(shard).num_tokens;
    std::vector<uint16_t> chunk;
    for (int64_t first = 0; first < n;) {
      chunk.resize(static_cast<size_t>(std::min<int64_t>(n - first, 1 << 20)));
      shards_->read_tokens(shard, first, static_cast<int64_t>(chunk.size()), chunk.data());
      for (size_t i = 0; i < chunk.size(); ++i)
        if (chunk[i] == options_.bos) index->push_back(first + static_cast<int64_t>(i));
      first += static_cast<int64_t>(chunk.size());
    }
    slot = std::move(index);
  }
  return *slot;
}

bool DocumentLoader::walk_row(const DocumentStage& stage, Cursor& at,
                              std::vector<Piece>* pieces) const {
  const std::vector<int64_t>& bos = bos_index(at.shard);
  const auto n = static_cast<int64_t>(bos.size());
  const int64_t shard_end = shards_->shard(at.shard).num_tokens;
  const int64_t need = stage.row_tokens + 1;  // T inputs and the last target
  if (pieces) pieces->clear();
  for (int64_t taken = 0; taken < need;) {
    if (at.doc >= n) return false;
    const int64_t start = bos[static_cast<size_t>(at.doc)];
    ++at.doc;
    const int64_t next = at.doc < n ? bos[static_cast<size_t>(at.doc)] : shard_end;
    // The document to its end, truncated to max_doc_tokens, cut where the row is full.
    const int64_t end = std::min({next, start + stage.max_doc_tokens, start + need - taken});
    if (pieces) pieces->push_back({start, end});
    taken += end - start;
  }
  return true;
}

DocumentLoader::Cursor DocumentLoader::step_start(int64_t step) const {
  // starts_[s] for s < size - 1: where step s starts, checked to hold its rows; starts_.back():
  // where the walk stands after the last checked step. Extended up to `step`.
  if (starts_.empty()) starts_.push_back({});
  std::vector<Piece> pieces;
  std::vector<int64_t> docs_per_row;
  while (static_cast<int64_t>(starts_.size()) <= step + 1) {
    const auto s = static_cast<int64_t>(starts_.size()) - 1;
    const DocumentStage& stage = stage_of(s);
    Cursor& start = starts_.back();
    // A step whose rows run past its shard's last document starts over at the next shard's
    // first (every shard tried once before giving up).
    Cursor c = start;
    for (int64_t shards_tried = 0;; ++shards_tried) {
      bool fits = true;
      docs_per_row.clear();
      for (int64_t row = 0; row < stage.rows && fits; ++row) {
        fits = walk_row(stage, c, &pieces);
        docs_per_row.push_back(static_cast<int64_t>(pieces.size()));
      }
      if (fits) break;
      ENGINE_CHECK(shards_tried < shards_->num_shards(),
                   "document loader: no shard of '" + options_.pattern + "' holds the " +
                       std::to_string(stage.rows) + " rows of " + std::to_string(stage.row_tokens) +
                       " tokens of step " + std::to_string(s) + " in its documents");
      start.shard = (start.shard + 1) % shards_->num_shards();
      start.doc = 0;
      c = start;
    }
    // The record's cu_seqlens copy fails on a row of more documents than its entries hold
    // (checked for the rows served only, as the record builds them after the shard check).
    for (size_t row = 0; row < docs_per_row.size(); ++row) {
      ENGINE_CHECK(docs_per_row[row] + 1 <= stage.max_docs,
                   "document loader: step " + std::to_string(s) + " row " + std::to_string(row) +
                       " of " + std::to_string(stage.rows) + " packs " +
                       std::to_string(docs_per_row[row]) + " documents into " +
                       std::to_string(stage.row_tokens) + " tokens, more than its " +
                       std::to_string(stage.max_docs) + " cu_seqlens entries hold (" +
                       std::to_string(stage.max_docs - 1) +
                       " documents; the record fails here too): raise the cap or shorten the "
                       "rows (shard '" +
                       shards_->shard(start.shard).path + "')");
    }
    starts_.push_back(c);
  }
  return starts_[static_cast<size_t>(step)];
}

void DocumentLoader::load(int64_t step, int64_t micro_step, Batch& out) const {
  const DocumentStage& stage = stage_of(step);
  ENGINE_CHECK(micro_step >= 0 && micro_step < micro_steps(step),
               "document loader: micro_step " + std::to_string(micro_step) + " not in [0, " +
                   std::to_string(micro_steps(step)) + ") at step " + std::to_string(step));
  Cursor c = step_start(step);
  const int64_t row = micro_step * options_.world + options_.rank;
  for (int64_t r = 0; r < row; ++r)
    walk_row(stage, c, nullptr);
  std::vector<Piece> pieces;
  walk_row(stage, c, &pieces);

  const int64_t T = stage.row_tokens;
  std::vector<uint16_t> buf(static_cast<size_t>(T + 1));
  int64_t at = 0;
  for (const Piece& p : pieces) {
    shards_->read_tokens(c.shard, p.start, p.end - p.start, buf.data() + at);
    at += p.end - p.start;
  }
  out.resize(1, T);
  for (int64_t t = 0; t < T; ++t) {
    out.inputs[static_cast<size_t>(t)] = buf[static_cast<size_t>(t)];
    out.targets[static_cast<size_t>(t)] = buf[static_cast<size_t>(t + 1)];
  }
  int64_t offset = 0;
  for (int64_t i = 0; i < c.shard; ++i)
    offset += shards_->shard(i).num_tokens;
  out.sequences[0] = offset + pieces.front().start;
  // Each document's end within the inputs: the last one stops a token short (its last token is
  // only a target). Then T up to max_docs entries.
  out.max_docs = stage.max_docs;
  out.cu_seqlens.assign(static_cast<size_t>(stage.max_docs), static_cast<int32_t>(T));
  out.cu_seqlens[0] = 0;
  int64_t end = 0;
  for (size_t i = 0; i < pieces.size(); ++i) {
    end += pieces[i].end - pieces[i].start;
    out.cu_seqlens[i + 1] = static_cast<int32_t>(i + 1 == pieces.size() ? end - 1 : end);
  }
  if (options_.bigram_table_rows > 0) {
    out.bigram.resize(static_cast<size_t>(T));
    bigram_hash(out.inputs, options_.bigram_table_rows, out.bigram);
  }
}

void DocumentLoader::next(Batch& out) {
  load(step_, micro_step_, out);
  if (++micro_step_ == micro_steps(step_)) {
    micro_step_ = 0;
    ++step_;
  }
}

void DocumentLoader::restore(const LoaderState& state) {
  ENGINE_CHECK(state.seed == options_.seed,
               "document loader: checkpoint seed " + std::to_string(state.seed) +
                   " differs from the configured seed " + std::to_string(options_.seed));
  ENGINE_CHECK(state.fingerprint == 0 || state.fingerprint == fingerprint_,
               "document loader: the checkpoint was taken over different data or stages (shard "
               "token counts of '" +
                   options_.pattern +
                   "', the BOS token or a stage's steps, rows, row tokens, document length or "
                   "cap differ): resuming would not see the same batches");
  ENGINE_CHECK(
      state.step >= 0 && state.micro_step >= 0 && state.micro_step < micro_steps(state.step),
      "document loader: bad checkpoint position step " + std::to_string(state.step) +
          " micro_step " + std::to_string(state.micro_step));
  step_ = state.step;
  micro_step_ = state.micro_step;
}

}  // namespace data
