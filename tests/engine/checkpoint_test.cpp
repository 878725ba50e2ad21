#include "engine/checkpoint/checkpoint_files.h"

#include <gtest/gtest.h>

#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>
#include <filesystem>

#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <numeric>
#include <optional>

#include "core/check.h"
#include "tests/test_util.h"

using test_util::error_of;

namespace {

namespace fs = std::filesystem;

core::Tensor iota(const core::Shape& shape, float start) {
  std::vector<float> v(static_cast<size_t>(core::shape_numel(shape)));
  std::iota(v.begin(), v.end(), start);
  return core::Tensor::from_vector(shape, v);
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = (fs::temp_directory_path() /
             ("engine_ckpt_test_" +
              std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())))
                .string();
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Two "ranks": a [5, 3] tensor split along dim 0 as [0, 2) + [2, 5), a [2, 4] tensor split along
  // dim 1 as [0, 1) + [1, 4), and a whole [3] tensor saved by rank 0 only. `val_loss`: the
  // validation loss the manifest records (kValLossKey), rotated with `keep_best`.
  std::string save(int64_t step, int keep = 3, float offset = 0,
                   std::optional<double> val_loss = std::nullopt, bool keep_best = false) {
    core::Tensor a = iota({5, 3}, offset), b = iota({2, 4}, 100 + offset), c = iota({3}, 200);
    prepare_staging(root_, step);
    std::string staging = engine::staging_path(root_, step);
    engine::write_rank_file(staging, 0,
                            {{"a", {5, 3}, 0, 0, a.slice(0, 0, 2).clone()},
                             {"b", {2, 4}, 1, 0, b.slice(1, 0, 1).clone()},
                             {"c", {3}, 0, 0, c}},
                            {{"c/step", step}});
    engine::write_rank_file(staging, 1,
                            {{"a", {5, 3}, 0, 2, a.slice(0, 2, 3).clone()},
                             {"b", {2, 4}, 1, 1, b.slice(1, 1, 3).clone()}},
                            {{"a/step", step}});
    engine::Manifest m;
    m.step = step;
    m.world_size = 2;
    m.config_yaml = "train:\n  steps: 10\n";
    m.state = {{"data.step", std::to_string(step)}, {"rng.position", "42"}};
    if (val_loss) m.state[engine::kValLossKey] = std::to_string(*val_loss);
    return engine::commit_checkpoint(root_, m, keep, keep_best);
  }
  // The folder names of the complete checkpoints, oldest first.
  std::vector<std::string> kept() const {
    std::vector<std::string> names;
    for (const std::string& dir : engine::list_checkpoints(root_))
      names.push_back(fs::path(dir).filename().string());
    return names;
  }
  static std::string prepare_staging(const std::string& root, int64_t step) {
    return engine::prepare_staging(root, step);
  }

  std::string root_;
};

TEST(Fnv1a, KnownValues) {
  EXPECT_EQ(engine::fnv1a64("", 0), 0xcbf29ce484222325ull);
  EXPECT_EQ(engine::fnv1a64("a", 1), 0xaf63dc4c8601ec8cull);
  EXPECT_EQ(engine::fnv1a64("foobar", 6), 0x85944171f73967e8ull);
}

// checkpoint.keep_best: the checkpoint with the lowest validation loss stays out of the rotation
// (a step saved without an evaluation is no candidate) until a better one is saved; without it
// only the newest `keep` stay.
TEST_F(CheckpointTest, KeepBestKeepsTheLowestValidationLossOutOfTheRotation) {
  save(1, 2, 0, 3.0, true);
  save(2, 2, 0, 1.5, true);
  save(3, 2, 0, std::nullopt, true);
  save(4, 2, 0, 2.0, true);
  save(5, 2, 0, 1.7, true);
  EXPECT_EQ(kept(), (std::vector<std::string>{"step_00000002", "step_00000004", "step_00000005"}));
  save(6, 2, 0, 1.0, true);
  EXPECT_EQ(kept(), (std::vector<std::string>{"step_00000005", "step_00000006"}));

  fs::remove_all(root_);
  save(1, 1, 0, 1.0, false);
  save(2, 1, 0, 2.0, false);
  EXPECT_EQ(kept(), (std::vector<std::string>{"step_00000002"}));
}

TEST_F(CheckpointTest, ManifestRoundTrip) {
  std::string dir = save(7);
  EXPECT_EQ(fs::path(dir).filename(), "step_00000007");
  engine::Manifest m = engine::read_manifest(dir);
  EXPECT_EQ(m.step, 7);
  EXPECT_EQ(m.world_size, 2);
  EXPECT_EQ(m.state.at("data.step"), "7");
  EXPECT_EQ(m.state.at("rng.position"), "42");
  EXPECT_EQ(m.config_yaml, "train:\n  steps: 10\n");
  ASSERT_EQ(m.files.size(), 2u);
  EXPECT_EQ(m.files[1].file, "rank_00001.safetensors");
  EXPECT_EQ(m.files[1].checksum, engine::fnv1a64_file(dir + "/rank_00001.safetensors"));
  EXPECT_EQ(m.slices.size(), 5u);
  EXPECT_EQ(m.counters, (std::map<std::string, int64_t>{{"a/step", 7}, {"c/step", 7}}));
  EXPECT_FALSE(fs::exists(engine::staging_path(root_, 7)));
}

TEST_F(CheckpointTest, ReadsAnyRangeAcrossFiles) {
  std::string dir = save(3);
  engine::CheckpointReader reader(dir);
  EXPECT_EQ(reader.read_full("a").to_vector(), iota({5, 3}, 0).to_vector());
  EXPECT_EQ(reader.read_full("b").to_vector(), iota({2, 4}, 100).to_vector());
  EXPECT_EQ(reader.read_full("c").to_vector(), iota({3}, 200).to_vector());
  // Re-shard "a" over 3 ranks: rows [1, 3) straddle both files.
  core::Tensor part = core::Tensor::empty({2, 3});
  reader.read("a", 0, 1, part);
  EXPECT_EQ(part.to_vector(), iota({5, 3}, 0).slice(0, 1, 2).clone().to_vector());
  // "b" read along dim 1 columns [0, 3), and "b" as a row range of the whole tensor.
  core::Tensor cols = core::Tensor::empty({2, 3});
  reader.read("b", 1, 0, cols);
  EXPECT_EQ(cols.to_vector(), iota({2, 4}, 100).slice(1, 0, 3).clone().to_vector());
  core::Tensor row = core::Tensor::empty({1, 4});
  EXPECT_NE(error_of([&] { reader.read("b", 0, 1, row); }).find("do not cover"), std::string::npos);
  core::Tensor bad = core::Tensor::empty({2, 2});
  EXPECT_NE(error_of([&] { reader.read("a", 0, 0, bad); }).find("tensor a"), std::string::npos);
  EXPECT_NE(error_of([&] { reader.read_full("zz"); }).find("no tensor zz"), std::string::npos);
}

TEST_F(CheckpointTest, KeepsNewestKAndIgnoresStaging) {
  for (int64_t s : {2, 4, 6, 8})
    save(s, 2);
  prepare_staging(root_, 10);  // an interrupted save
  auto all = engine::list_checkpoints(root_);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(fs::path(all[0]).filename(), "step_00000006");
  EXPECT_EQ(fs::path(all[1]).filename(), "step_00000008");
  EXPECT_EQ(engine::resolve_resume(root_, "auto"), all[1]);
  EXPECT_EQ(engine::resolve_resume(root_, ""), "");
  EXPECT_EQ(engine::resolve_resume(root_ + "/none", "auto"), "");
  // The next complete save removes the leftover staging folder.
  save(12, 2);
  EXPECT_FALSE(fs::exists(engine::staging_path(root_, 10)));
}

// The rotation never leaves a half-removed checkpoint under a checkpoint's name. Removed in place,
// file by file, a kill in between left a step_ folder with a rank file and no manifest, which no
// later save removed (tools/soak.sh found one). Watched with inotify: the oldest is renamed
// before any of its files goes, and the next save removes what a cut-short removal leaves.
TEST_F(CheckpointTest, RotationRenamesTheOldestBeforeDeletingItsFiles) {
  save(1, 2);
  save(2, 2);
  const int fd = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_GE(::inotify_add_watch(fd, (root_ + "/step_00000001").c_str(),
                                IN_DELETE | IN_MOVE_SELF | IN_DELETE_SELF),
            0);
  save(3, 2);
  std::vector<uint32_t> events;
  alignas(inotify_event) char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof(buf))) > 0;)
    for (char* p = buf; p < buf + n;) {
      const auto* e = reinterpret_cast<const inotify_event*>(p);
      events.push_back(e->mask);
      p += sizeof(inotify_event) + e->len;
    }
  ::close(fd);
  ASSERT_FALSE(events.empty());
  EXPECT_TRUE(events.front() & IN_MOVE_SELF)
      << "a file of step_00000001 was deleted while the folder still had its name";
  EXPECT_EQ(kept(), (std::vector<std::string>{"step_00000002", "step_00000003"}));
  EXPECT_FALSE(fs::exists(root_ + "/step_00000001.old"));

  fs::create_directories(root_ + "/step_00000002.old");  // a removal cut short
  std::ofstream(root_ + "/step_00000002.old/rank_00001.safetensors") << "x";
  save(4, 2);
  EXPECT_FALSE(fs::exists(root_ + "/step_00000002.old"));
  EXPECT_EQ(kept(), (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

TEST_F(CheckpointTest, SavingAStepAgainReplacesIt) {
  save(5);
  std::string dir = save(5, 3, 1000);
  engine::CheckpointReader reader(dir);
  EXPECT_EQ(reader.read_full("a").to_vector(), iota({5, 3}, 1000).to_vector());
  EXPECT_EQ(engine::list_checkpoints(root_).size(), 1u);
}

TEST_F(CheckpointTest, CorruptCheckpointRefusedAndOlderOffered) {
  std::string older = save(4);
  std::string newer = save(9);
  {
    std::fstream f(newer + "/rank_00001.safetensors",
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  std::string msg = error_of([&] { engine::resolve_resume(root_, "auto"); });
  EXPECT_NE(msg.find("rank_00001.safetensors is corrupt"), std::string::npos) << msg;
  EXPECT_NE(msg.find("next older checkpoint is " + older), std::string::npos) << msg;
  EXPECT_EQ(engine::resolve_resume(root_, older), older);
  msg = error_of([&] { engine::CheckpointReader r(newer); });
  EXPECT_NE(msg.find("corrupt"), std::string::npos) << msg;
}

TEST_F(CheckpointTest, TruncatedMissingAndIncompleteRefused) {
  std::string dir = save(3);
  fs::resize_file(dir + "/rank_00000.safetensors", 16);
  std::string msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("rank_00000.safetensors has 16 bytes"), std::string::npos) << msg;
  fs::remove(dir + "/rank_00000.safetensors");
  msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("rank_00000.safetensors is missing"), std::string::npos) << msg;
  fs::remove(dir + "/manifest.yaml");
  msg = error_of([&] { engine::resolve_resume(root_, dir); });
  EXPECT_NE(msg.find("incomplete"), std::string::npos) << msg;
  EXPECT_NE(msg.find("no older checkpoint"), std::string::npos) << msg;
  std::ofstream(dir + "/manifest.yaml") << "format: something-else\n";
  msg = error_of([&] { engine::read_manifest(dir); });
  EXPECT_NE(msg.find("manifest.yaml"), std::string::npos) << msg;
}

// The whole text of a file.
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Checksums of every file of every folder under root: what "nothing saved changed" compares.
std::map<std::string, uint64_t> tree_checksums(const std::string& root) {
  std::map<std::string, uint64_t> sums;
  for (const auto& e : fs::recursive_directory_iterator(root))
    if (e.is_regular_file()) sums[e.path().string()] = engine::fnv1a64_file(e.path().string());
  return sums;
}

// Rewrites a manifest with `from` replaced by `to` and a freshly computed checksum line, as a
// buggy writer (not a bit flip) would leave it.
void rewrite_manifest(const std::string& dir, const std::string& from, const std::string& to) {
  std::string text = slurp(dir + "/manifest.yaml");
  text = text.substr(0, text.rfind("manifest_fnv1a64: "));
  const size_t at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from;
  text.replace(at, from.size(), to);
  char sum[32];
  std::snprintf(sum, sizeof(sum), "%016llx",
                static_cast<unsigned long long>(engine::fnv1a64(text.data(), text.size())));
  std::ofstream(dir + "/manifest.yaml", std::ios::trunc)
      << text << "manifest_fnv1a64: " << sum << "\n";
}

TEST_F(CheckpointTest, EditedManifestRefusedByItsChecksum) {
  std::string dir = save(20);
  const auto before = tree_checksums(root_);
  std::string text = slurp(dir + "/manifest.yaml");
  const size_t at = text.find("data.step: 20");
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, 13, "data.step: 7");
  std::ofstream(dir + "/manifest.yaml", std::ios::trunc) << text;
  std::string msg = error_of([&] { engine::resolve_resume(root_, "auto"); });
  EXPECT_NE(msg.find(dir + "/manifest.yaml was changed after it was written"), std::string::npos)
      << msg;
  // A manifest cut short loses its checksum line.
  std::ofstream(dir + "/manifest.yaml", std::ios::trunc) << text.substr(0, text.size() / 2);
  msg = error_of([&] { engine::read_manifest(dir); });
  EXPECT_NE(msg.find("has no manifest_fnv1a64 line"), std::string::npos) << msg;
  // Nothing but the edited manifest changed.
  auto after = tree_checksums(root_);
  after.erase(dir + "/manifest.yaml");
  auto expected = before;
  expected.erase(dir + "/manifest.yaml");
  EXPECT_EQ(after, expected);
}

TEST_F(CheckpointTest, InconsistentManifestRefusedByName) {
  std::string dir = save(20);
  rewrite_manifest(dir, "data.step: 20", "data.step: 7");
  std::string msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("is inconsistent: step 20 but data.step 7"), std::string::npos) << msg;

  dir = save(20);
  rewrite_manifest(dir, "a/step: 20", "a/step: -3");
  msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("optimizer counter a/step = -3 is outside [0, step 20]"), std::string::npos)
      << msg;

  dir = save(20);
  rewrite_manifest(dir, "step: 20\n", "step: 7\n");
  msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("step 7 but the folder is step_00000020"), std::string::npos) << msg;

  // Found by the manifest fuzzer: text where a number belongs was a std::invalid_argument.
  dir = save(20);
  rewrite_manifest(dir, "fnv1a64: ", "fnv1a64: zz");
  msg = error_of([&] { engine::read_manifest(dir); });
  EXPECT_NE(msg.find("is malformed: the checksum of rank_00000.safetensors is 'zz"),
            std::string::npos)
      << msg;
  dir = save(20);
  rewrite_manifest(dir, "data.step: 20", "data.step: twenty");
  msg = error_of([&] { engine::read_manifest(dir); });
  EXPECT_NE(msg.find("is inconsistent"), std::string::npos) << msg;
  dir = save(20);
  rewrite_manifest(dir, "rng.position: 42", "rng.position: 42\n  train.tokens: many");
  msg = error_of([&] { engine::read_manifest(dir); });
  EXPECT_NE(msg.find("train.tokens is 'many', not an integer"), std::string::npos) << msg;

  dir = save(20);
  fs::rename(dir, root_ + "/step_00000009");
  msg = error_of([&] { engine::resolve_resume(root_, "auto"); });
  EXPECT_NE(msg.find("step 20 but the folder is step_00000009"), std::string::npos) << msg;
}

// A manifest is untrusted input (checkpoints are shared): its checksum is no signature, so each
// hostile edit below is re-hashed, and each must be refused before any file is opened or any
// byte copied, naming the checkpoint and the entry.
TEST_F(CheckpointTest, ManifestFileEntriesStayInsideTheFolder) {
  fs::create_directories(root_);
  std::ofstream(root_ + "/outside.safetensors") << "not a checkpoint";
  for (const std::string& bad :
       {std::string("../outside.safetensors"), std::string("../../../outside.safetensors"),
        root_ + "/outside.safetensors", std::string("sub/rank_00001.safetensors"),
        std::string("..")}) {
    const std::string dir = save(20);
    rewrite_manifest(dir, "file: rank_00001.safetensors", "file: \"" + bad + "\"");
    const std::string msg = error_of([&] { engine::CheckpointReader reader(dir); });
    EXPECT_NE(msg.find("file entry '" + bad + "' is not a plain file name"), std::string::npos)
        << bad << ": " << msg;
  }
  // A slice naming a file the manifest does not list.
  const std::string dir = save(20);
  rewrite_manifest(dir, "name: b, file: rank_00000.safetensors",
                   "name: b, file: other.safetensors");
  const std::string msg = error_of([&] { engine::CheckpointReader reader(dir); });
  EXPECT_NE(msg.find("slice of tensor 'b' in 'other.safetensors': the file is not among the "
                     "manifest's files"),
            std::string::npos)
      << msg;
}

TEST_F(CheckpointTest, ManifestSlicesStayInsideTheirTensors) {
  struct Case {
    std::string from, to, expect;
  };
  for (const Case& c : std::vector<Case>{
           {"begin: 2, end: 5", "begin: 2, end: 100000",
            "range [2, 100000) along dim 0 is outside [0, 5)"},
           {"begin: 2, end: 5", "begin: -100000, end: 5", "range [-100000, 5) along dim 0"},
           {"begin: 2, end: 5", "begin: 4, end: 3", "range [4, 3) along dim 0"},
           {"dim: 1, begin: 0, end: 1", "dim: 7, begin: 0, end: 1",
            "dim 7 of a 2-dimensional tensor"},
           {"shape: [5, 3]", "shape: [4294967296, 4294967296]", "is not a tensor shape"},
           {"shape: [5, 3]", "shape: [5, -3]", "is not a tensor shape"},
           {"shape: [5, 3]", "shape: [6, 3]", "another slice says [6, 3]"}}) {
    const std::string dir = save(20);
    rewrite_manifest(dir, c.from, c.to);
    const std::string msg = error_of([&] { engine::CheckpointReader reader(dir); });
    EXPECT_NE(msg.find(c.expect), std::string::npos) << c.to << ": " << msg;
    EXPECT_NE(msg.find(dir), std::string::npos) << msg;
  }
  // In range, but longer than the rows its file holds: refused when the checkpoint is opened,
  // by every rank alike (a rank used to find it only when it read that slice, alone).
  const std::string dir = save(20);
  rewrite_manifest(dir, "begin: 0, end: 2", "begin: 0, end: 3");
  const std::string msg = error_of([&] { engine::CheckpointReader reader(dir); });
  EXPECT_NE(msg.find("checkpoint " + dir +
                     " tensor a: rank_00000.safetensors holds F32[2, 3] "
                     "for the slice [0, 3) along dim 0, which is F32[3, 3]"),
            std::string::npos)
      << msg;
}

TEST_F(CheckpointTest, RankFileThatIsNoRegularFileIsRefused) {
  const std::string dir = save(20);
  const std::string rank_file = dir + "/rank_00001.safetensors";
  fs::remove(rank_file);
  ASSERT_EQ(mkfifo(rank_file.c_str(), 0600), 0);
  std::string msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("entry 'rank_00001.safetensors' is not a regular file"), std::string::npos)
      << msg;
  fs::remove(rank_file);
  fs::create_symlink("/dev/zero", rank_file);
  msg = error_of([&] { engine::verify_checkpoint(dir); });
  EXPECT_NE(msg.find("entry 'rank_00001.safetensors' is not a regular file"), std::string::npos)
      << msg;
}

// Re-signs `file` of checkpoint `dir` in its manifest (its size and checksum as they are now), as
// a tool that rewrites checkpoints would: the checksums no longer reveal the change.
void resign(const std::string& dir, const std::string& file) {
  for (const engine::FileInfo& f : engine::read_manifest(dir).files) {
    if (f.file != file) continue;
    const std::string path = dir + "/" + file;
    char old_sum[32], new_sum[32];
    std::snprintf(old_sum, sizeof(old_sum), "%016llx", static_cast<unsigned long long>(f.checksum));
    std::snprintf(new_sum, sizeof(new_sum), "%016llx",
                  static_cast<unsigned long long>(engine::fnv1a64_file(path)));
    rewrite_manifest(dir, "bytes: " + std::to_string(f.bytes) + ", fnv1a64: " + old_sum,
                     "bytes: " + std::to_string(fs::file_size(path)) + ", fnv1a64: " + new_sum);
  }
}

// A damaged newest checkpoint whose manifest was re-signed passes the checksums; its tensor
// headers do not. It was refused at load, without the line that offers the next older one.
TEST_F(CheckpointTest, DamagedNewestRefusedOfferingTheNextOlder) {
  const std::string older = save(4);
  const std::string newer = save(9);
  const std::string rank1 = newer + "/rank_00001.safetensors";
  // With the overwrite a resume from it needs while the damaged one is newer (it was left out,
  // and following the offer met the next refusal).
  const std::string offer = "; the next older checkpoint is " + older +
                            " (resume from it with --set checkpoint.resume=" + older +
                            " --set checkpoint.overwrite=true, which deletes the 1 newer "
                            "checkpoint(s) in " +
                            root_ + " once it is accepted)";
  // Cut short.
  fs::resize_file(rank1, fs::file_size(rank1) - 8);
  resign(newer, "rank_00001.safetensors");
  std::string msg = error_of([&] { engine::resolve_resume(root_, "auto"); });
  EXPECT_EQ(msg.rfind("cannot resume from " + newer + ": ", 0), 0u) << msg;
  EXPECT_NE(msg.find(offer), std::string::npos) << msg;
  // Another dtype (F64, F16) for a slice, at the right shape.
  for (const core::StDType dtype : {core::StDType::F64, core::StDType::F16}) {
    const size_t bytes = dtype == core::StDType::F64 ? 8 : 2;
    core::SafetensorsWriter w;
    w.add_bytes("a", dtype, {3, 3}, std::vector<std::byte>(9 * bytes));
    w.set_metadata("slice.a", "0;2;5,3");
    w.add("b", iota({2, 3}, 101));
    w.set_metadata("slice.b", "1;1;2,4");
    w.set_metadata("counter.a/step", "9");
    w.write(rank1);
    resign(newer, "rank_00001.safetensors");
    msg = error_of([&] { engine::resolve_resume(root_, "auto"); });
    EXPECT_NE(msg.find("cannot resume from " + newer + ": checkpoint " + newer + " tensor a: " +
                       "rank_00001.safetensors holds " + core::st_dtype_name(dtype) + "[3, 3]"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find(offer), std::string::npos) << msg;
  }
  EXPECT_EQ(engine::resolve_resume(root_, older), older);
}

// A manifest.yaml that is a folder gave libstdc++'s "basic_filebuf::underflow error reading the
// file: Is a directory".
TEST_F(CheckpointTest, ManifestThatIsAFolderIsRefusedInOneLine) {
  const std::string older = save(4);
  const std::string newer = save(9);
  fs::remove(newer + "/manifest.yaml");
  fs::create_directory(newer + "/manifest.yaml");
  const std::string msg = error_of([&] { engine::resolve_resume(root_, "auto"); });
  EXPECT_EQ(msg.rfind("cannot resume from " + newer + ": checkpoint manifest " + newer +
                          "/manifest.yaml is not a regular file (it is a folder)",
                      0),
            0u)
      << msg;
  EXPECT_NE(msg.find("; the next older checkpoint is " + older), std::string::npos) << msg;
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
}

// A step folder without a manifest is no checkpoint: passed over by resume=auto, and listed so
// that it can be reported.
TEST_F(CheckpointTest, StepFolderWithoutManifestIsListedAsIncomplete) {
  const std::string older = save(4);
  const std::string newer = save(9);
  fs::remove(newer + "/manifest.yaml");
  EXPECT_EQ(engine::incomplete_checkpoints(root_), (std::vector<std::string>{newer}));
  EXPECT_EQ(engine::resolve_resume(root_, "auto"), older);
}

TEST_F(CheckpointTest, MissingPathAndFolderOfCheckpointsAreNamed) {
  std::string msg = error_of([&] { engine::verify_checkpoint(root_ + "/nothing_here"); });
  EXPECT_NE(msg.find(root_ + "/nothing_here does not exist"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("manifest.yaml is missing"), std::string::npos) << msg;
  std::string newest = save(8);
  msg = error_of([&] { engine::verify_checkpoint(root_); });
  EXPECT_NE(msg.find("is a folder of checkpoints, not a checkpoint: give one of them, e.g. the "
                     "newest " +
                     newest),
            std::string::npos)
      << msg;
}

// Disk full while committing: /dev/full stands in for the full disk (every write fails with
// ENOSPC). The error names the file and the reason; every complete checkpoint is unchanged.
TEST_F(CheckpointTest, FailedWritesNameTheFileAndKeepCompleteCheckpoints) {
  save(4);
  save(8);
  const auto before = tree_checksums(root_);
  const std::string staging = prepare_staging(root_, 12);
  fs::create_symlink("/dev/full", staging + "/manifest.yaml.tmp");
  core::Tensor a = iota({5, 3}, 0);
  engine::write_rank_file(staging, 0, {{"a", {5, 3}, 0, 0, a}});
  engine::Manifest m;
  m.step = 12;
  m.world_size = 1;
  std::string msg = error_of([&] { engine::commit_checkpoint(root_, m, 1); });
  EXPECT_NE(msg.find("writing " + staging + "/manifest.yaml.tmp failed"), std::string::npos) << msg;
  EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;

  // A rank file: its writer's temporary name is unpredictable (core::AtomicFile), so the full
  // disk is a file-size limit here (write() fails with EFBIG, as it would with ENOSPC).
  prepare_staging(root_, 12);
  const std::string rank_file = staging + "/" + engine::rank_file_name(0);
  EXPECT_EQ(test_util::run_with_file_size_limit(
                16,
                [&] {
                  const std::string m = error_of([&] {
                    engine::write_rank_file(staging, 0, {{"a", {5, 3}, 0, 0, a}});
                  });
                  std::fprintf(stderr, "%s\n", m.c_str());
                  return m.find("cannot write the safetensors file " + rank_file +
                                ": File too large") != std::string::npos
                             ? 0
                             : 1;
                }),
            0);
  for (const fs::directory_entry& e : fs::directory_iterator(staging))
    EXPECT_FALSE(e.path().filename().string().starts_with(".")) << "left " << e.path();

  auto after = tree_checksums(root_);
  for (auto it = after.begin(); it != after.end();)
    it = it->first.find(".tmp") != std::string::npos ? after.erase(it) : std::next(it);
  EXPECT_EQ(after, before);
  EXPECT_EQ(engine::list_checkpoints(root_).size(), 2u);
  EXPECT_NO_THROW(engine::resolve_resume(root_, "auto"));
}

}  // namespace
