#include "core/safetensors.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "core/check.h"
#include "tests/test_util.h"

using test_util::error_of;

using core::SafetensorsReader;
using core::SafetensorsWriter;
using core::StDType;
using core::Tensor;

namespace {

class TempDir {
 public:
  TempDir() {
    path_ = std::filesystem::temp_directory_path() /
            ("st_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  static inline int counter_ = 0;
  std::filesystem::path path_;
};

// A raw file: u64 length, header (not padded unless given so), data bytes.
void write_raw(const std::string& path, const std::string& header, size_t data_bytes) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  std::string data(data_bytes, '\0');
  out << data;
}

}  // namespace

TEST(Safetensors, RoundTripF32AndBytes) {
  TempDir dir;
  Tensor a = Tensor::from_vector({2, 3}, std::vector<float>{1, 2, 3, 4, 5, -6.5f});
  Tensor b = Tensor::from_vector({4}, std::vector<float>{0.25f, 1e-30f, -0.f, 7});
  Tensor empty = Tensor::empty({0, 5});
  std::vector<std::byte> ints(3 * 4);
  const int32_t iv[3] = {-1, 7, 1 << 30};
  std::memcpy(ints.data(), iv, sizeof iv);

  SafetensorsWriter w;
  w.add("blocks.0.w", a);
  w.add("b", b);
  w.add("empty", empty);
  w.add_bytes("ids", StDType::I32, {3}, ints);
  const std::string path = dir.file("x.safetensors");
  w.write(path);

  SafetensorsReader r(path);
  EXPECT_EQ(r.tensors().size(), 4u);
  EXPECT_EQ(r.data_start() % 8, 0u);
  EXPECT_EQ(r.read("blocks.0.w").to_vector(), a.to_vector());
  EXPECT_EQ(r.read("b").to_vector(), b.to_vector());
  EXPECT_EQ(r.read("empty").shape(), (core::Shape{0, 5}));
  EXPECT_EQ(r.info("ids").dtype, StDType::I32);
  EXPECT_EQ(r.read_bytes("ids"), ints);
  EXPECT_NE(error_of([&] { r.read("ids"); }).find("has dtype I32"), std::string::npos);
  EXPECT_NE(error_of([&] { r.info("nope"); }).find("no tensor \"nope\""), std::string::npos);

  auto all = core::load_safetensors(path);
  EXPECT_EQ(all.tensors.size(), 3u);  // the I32 one is bytes only
  EXPECT_EQ(all.tensors.at("b").to_vector(), b.to_vector());
  // No temporary file is left behind.
  int files = 0;
  for (auto& e : std::filesystem::directory_iterator(std::filesystem::path(path).parent_path())) {
    (void)e;
    ++files;
  }
  EXPECT_EQ(files, 1);
}

TEST(Safetensors, OtherDtypesAreRecognised) {
  TempDir dir;
  SafetensorsWriter w;
  w.add_bytes("h", StDType::BF16, {2}, std::vector<std::byte>(4, std::byte{0x3f}));
  w.add_bytes("d", StDType::F64, {1, 1}, std::vector<std::byte>(8));
  w.add_bytes("flags", StDType::BOOL, {3}, std::vector<std::byte>(3));
  const std::string path = dir.file("d.safetensors");
  w.write(path);
  SafetensorsReader r(path);
  Tensor h = r.read("h");
  EXPECT_EQ(h.dtype(), core::DType::BF16);
  EXPECT_EQ(h.nbytes(), 4u);
  EXPECT_EQ(r.info("d").dtype, StDType::F64);
  EXPECT_EQ(r.info("d").end - r.info("d").begin, 8u);
  EXPECT_EQ(r.info("flags").dtype, StDType::BOOL);
  EXPECT_EQ(r.read("d").dtype(), core::DType::F64);
  EXPECT_NE(error_of([&] { r.read("flags"); }).find("has dtype BOOL"), std::string::npos);
  EXPECT_NE(error_of([&] { r.read_f32("d"); }).find("has dtype F64, expected F32, BF16 or F16"),
            std::string::npos);
}

// Half-precision files (a Hugging Face checkpoint stored in bf16 or f16) read as the floats they
// stand for, exactly: zeros, subnormals, the extremes, infinity and NaN included.
TEST(Safetensors, Bf16AndF16ReadAsF32Exactly) {
  TempDir dir;
  auto bytes = [](const std::vector<uint16_t>& bits) {
    std::vector<std::byte> out(bits.size() * 2);
    std::memcpy(out.data(), bits.data(), out.size());  // little-endian host (safetensors.cpp)
    return out;
  };
  const float inf = std::numeric_limits<float>::infinity();
  // f16: 1, -2, 65504 (largest), 2^-24 (smallest subnormal), 2^-14 (smallest normal), -0, inf.
  const std::vector<uint16_t> f16 = {0x3C00, 0xC000, 0x7BFF, 0x0001, 0x0400, 0x8000, 0x7C00};
  const std::vector<float> f16_values = {1.0f, -2.0f, 65504.0f, 0x1p-24f, 0x1p-14f, -0.0f, inf};
  // bf16: 1, -0.5, 3.140625 (0x4049), the largest finite, the smallest subnormal, -inf.
  const std::vector<uint16_t> b16 = {0x3F80, 0xBF00, 0x4049, 0x7F7F, 0x0001, 0xFF80};
  const std::vector<float> b16_values = {1.0f, -0.5f, 3.140625f, 0x1.FEp127f, 0x1p-133f, -inf};
  SafetensorsWriter w;
  w.add_bytes("half", StDType::F16, {7}, bytes(f16));
  w.add_bytes("brain", StDType::BF16, {2, 3}, bytes(b16));
  w.add_bytes("nan", StDType::F16, {1}, bytes({0x7E00}));
  const std::string path = dir.file("half.safetensors");
  w.write(path);
  SafetensorsReader r(path);
  EXPECT_EQ(r.read("half").dtype(), core::DType::F16);
  const Tensor h = r.read_f32("half"), b = r.read_f32("brain");
  EXPECT_EQ(h.dtype(), core::DType::F32);
  EXPECT_EQ(b.shape(), (core::Shape{2, 3}));
  const std::vector<float> hv = h.to_vector(), bv = b.to_vector();
  for (size_t i = 0; i < f16_values.size(); ++i) {
    EXPECT_EQ(hv[i], f16_values[i]) << i;
    EXPECT_EQ(std::signbit(hv[i]), std::signbit(f16_values[i])) << i;
  }
  EXPECT_EQ(bv, b16_values);
  EXPECT_TRUE(std::isnan(r.read_f32("nan").to_vector()[0]));
  // Written back as BF16 (a host tensor keeps its dtype) and read again: the same bits.
  SafetensorsWriter again;
  again.add("brain", r.read("brain"));
  again.write(dir.file("again.safetensors"));
  EXPECT_EQ(SafetensorsReader(dir.file("again.safetensors")).read_bytes("brain"), bytes(b16));
}

TEST(Safetensors, MetadataRoundTripWithEscapes) {
  TempDir dir;
  SafetensorsWriter w;
  w.set_metadata("hyperparameters", "{\"lr\": 0.05, \"q\": \"a\\\\b\"}\n\ttab");
  w.set_metadata("unicode", "caf\xc3\xa9");
  w.add("x", Tensor::from_vector({1}, std::vector<float>{3}));
  const std::string path = dir.file("m.safetensors");
  w.write(path);
  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata_value("hyperparameters"), "{\"lr\": 0.05, \"q\": \"a\\\\b\"}\n\ttab");
  EXPECT_EQ(r.metadata_value("unicode"), "caf\xc3\xa9");
  EXPECT_NE(error_of([&] { r.metadata_value("missing"); }).find("no __metadata__ key \"missing\""),
            std::string::npos);
}

TEST(Safetensors, OverwriteIsAtomicReplace) {
  TempDir dir;
  const std::string path = dir.file("o.safetensors");
  SafetensorsWriter w1;
  w1.add("x", Tensor::from_vector({1}, std::vector<float>{1}));
  w1.write(path);
  SafetensorsWriter w2;
  w2.add("y", Tensor::from_vector({2}, std::vector<float>{2, 3}));
  w2.write(path);
  SafetensorsReader r(path);
  EXPECT_FALSE(r.contains("x"));
  EXPECT_EQ(r.read("y").to_vector(), (std::vector<float>{2, 3}));
}

TEST(Safetensors, WriterRefusesDuplicatesAndWrongSizes) {
  SafetensorsWriter w;
  w.add("x", Tensor::zeros({2}));
  EXPECT_NE(error_of([&] { w.add("x", Tensor::zeros({2})); }).find("added twice"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              w.add_bytes("y", StDType::F64, {2}, std::vector<std::byte>(8));
            }).find("8 bytes for F64[2]"),
            std::string::npos);
}

// Each corruption is refused with a message naming the file and what is wrong.
struct Corruption {
  const char* label;
  std::string header;
  size_t data_bytes;
  const char* message;
};

TEST(Safetensors, CorruptionsAreRefused) {
  TempDir dir;
  const std::string ok = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::vector<Corruption> cases = {
      {"truncated data", "{" + ok + "}", 4, "file truncated"},
      {"trailing bytes", "{" + ok + "}", 12, "trailing bytes"},
      {"size mismatch", R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8, "needs 12"},
      {"overlap",
       R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
       8, "overlaps"},
      {"gap",
       R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})",
       12, "gap in the data before tensor \"b\""},
      {"begin after end", R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8,
       "begin 8 > end 0"},
      {"unknown dtype", R"({"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}})", 8,
       "unknown dtype \"F31\""},
      {"negative shape", R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8,
       "non-negative integer"},
      {"missing key", R"({"a":{"dtype":"F32","shape":[2]}})", 8, "needs dtype, shape"},
      {"extra key", R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})", 8,
       "unknown key \"x\""},
      {"duplicate tensor", "{" + ok + "," + ok + "}", 8, "duplicate key \"a\""},
      {"bad json", "{" + ok, 8, "invalid JSON header"},
      {"trailing comma", "{" + ok + ",}", 8, "expected a string key"},
      {"metadata not string", R"({"__metadata__":{"k":1}})", 0, "value of \"k\" is not a string"},
      {"not an object", "[1]", 0, "not a JSON object"},
      {"byte count wraps",
       R"({"a":{"dtype":"F64","shape":[4611686018427387904],"data_offsets":[0,0]}})", 0,
       "F64[4611686018427387904] needs more bytes than 64 bits count"},
  };
  for (const Corruption& c : cases) {
    const std::string path = dir.file("bad.safetensors");
    write_raw(path, c.header, c.data_bytes);
    std::string err = error_of([&] { SafetensorsReader r(path); });
    EXPECT_NE(err.find(c.message), std::string::npos) << c.label << ": " << err;
    EXPECT_NE(err.find(path), std::string::npos) << c.label << ": " << err;
  }
}

TEST(Safetensors, HeaderLengthPastEndOfFile) {
  TempDir dir;
  const std::string path = dir.file("short.safetensors");
  {
    std::ofstream out(path, std::ios::binary);
    uint64_t n = 1000;
    out.write(reinterpret_cast<const char*>(&n), 8);
    out << "{}";
  }
  EXPECT_NE(error_of([&] { SafetensorsReader r(path); }).find("runs past the end"),
            std::string::npos);
  {
    std::ofstream out(path, std::ios::binary);
    out << "abc";
  }
  EXPECT_NE(error_of([&] { SafetensorsReader r(path); }).find("too short"), std::string::npos);
  EXPECT_NE(error_of([&] { SafetensorsReader r(dir.file("missing")); }).find("cannot open"),
            std::string::npos);
}

// What is no regular file is refused before it is opened: opening a FIFO blocked until a writer
// came, and a device file never ends.
TEST(Safetensors, NoRegularFileIsRefused) {
  TempDir dir;
  const std::string fifo = dir.file("fifo.safetensors");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_NE(error_of([&] { SafetensorsReader r(fifo); }).find(fifo + ": not a regular file"),
            std::string::npos);
  const std::string device = dir.file("device.safetensors");
  std::filesystem::create_symlink("/dev/zero", device);
  EXPECT_NE(error_of([&] { SafetensorsReader r(device); }).find(device + ": not a regular file"),
            std::string::npos);
}

TEST(Safetensors, ReadsEveryGoldenOptimizerFile) {
  const std::filesystem::path root = ENGINE_GOLDEN_DIR;
  if (!std::filesystem::exists(root)) GTEST_SKIP() << "no golden directory " << root;
  int files = 0;
  for (auto& entry : std::filesystem::recursive_directory_iterator(root)) {
    if (entry.path().extension() != ".safetensors") continue;
    SafetensorsReader r(entry.path().string());
    EXPECT_FALSE(r.tensors().empty()) << entry.path();
    EXPECT_TRUE(r.metadata().count("optimizer") || r.metadata().count("case")) << entry.path();
    auto all = core::load_safetensors(entry.path().string());
    EXPECT_EQ(all.tensors.size(), r.tensors().size()) << entry.path();
    ++files;
  }
  EXPECT_GE(files, 20);
  // A value known from the file's own header.
  SafetensorsReader sq((root / "muon/square.safetensors").string());
  EXPECT_EQ(sq.metadata_value("steps"), "5");
  EXPECT_EQ(sq.read("init/blocks.0.attn.proj.weight").shape(), (core::Shape{64, 64}));
}
