#include "core/cpu/onednn_gemm.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "core/check.h"

namespace core::cpu {

namespace {

using dims = dnnl::memory::dims;
using dt = dnnl::memory::data_type;

// Everything a matmul primitive is made for (the last two: the operands' and C's types).
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, float, float, dt, dt>;

struct Matmul {
  dnnl::memory::desc a, b, c, scratchpad;
  dnnl::matmul primitive;
};

// One operand's descriptor: [batch,] rows x cols, row-major with leading dimension ld, or the
// transpose of such a matrix; a batch stride of 0 broadcasts one matrix to every member.
dnnl::memory::desc operand(dt type, bool trans, int64_t rows, int64_t cols, int64_t ld,
                           int64_t batch, int64_t stride) {
  const dims row_col = trans ? dims{1, ld} : dims{ld, 1};
  if (batch == 1) return dnnl::memory::desc(dims{rows, cols}, type, row_col);
  const int64_t members = stride == 0 ? 1 : batch;
  return dnnl::memory::desc(dims{members, rows, cols}, type,
                            dims{stride == 0 ? rows * cols : stride, row_col[0], row_col[1]});
}

const char* type_name(dt type) {
  return type == dt::f32 ? "f32" : "bf16";
}

// The engine and the primitives, made once. Each primitive takes its scratchpad from the caller
// (scratchpad_mode::user; the library's own is shared by all primitives and not safe to use from
// two threads at once), and each thread executes on a stream and a scratchpad of its own, so
// only the cache is locked.
struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mutex;
  std::map<Key, Matmul> primitives;  // a map: references stay valid as it grows

  const Matmul& get(const GemmArgs& r, dt in, dt out) {
    const Key key{r.trans_a, r.trans_b,  r.m,        r.n,        r.k,     r.lda,  r.ldb, r.ldc,
                  r.batch,   r.stride_a, r.stride_b, r.stride_c, r.alpha, r.beta, in,    out};
    std::lock_guard<std::mutex> lock(mutex);
    auto it = primitives.find(key);
    if (it != primitives.end()) return it->second;
    Matmul mm;
    mm.a = operand(in, r.trans_a, r.m, r.k, r.lda, r.batch, r.stride_a);
    mm.b = operand(in, r.trans_b, r.k, r.n, r.ldb, r.batch, r.stride_b);
    // A bf16 C is the f32 accumulation rounded once as it is stored: kmath's rounding of the
    // f32 C oneDNN computes (nearest even), which flushes sums below 2^-126 to zero in both.
    mm.c = operand(out, false, r.m, r.n, r.ldc, r.batch, r.stride_c);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
    if (r.alpha != 1.0f) attr.set_output_scales(0, {r.alpha});
    if (r.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(r.beta);  // C = alpha A B + beta C
      attr.set_post_ops(ops);
    }
    try {
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr, engine);
      mm.primitive = dnnl::matmul(pd);
      mm.scratchpad = pd.scratchpad_desc();
    } catch (const dnnl::error& e) {
      ENGINE_FAIL(std::string(type_name(in)) + " gemm(m=" + std::to_string(r.m) +
                  ", n=" + std::to_string(r.n) + ", k=" + std::to_string(r.k) +
                  ", batch=" + std::to_string(r.batch) + ", C " + type_name(out) +
                  "): oneDNN has no matmul for it: " + e.what());
    }
    return primitives.emplace(key, std::move(mm)).first->second;
  }
};

OneDnn& onednn() {
  static OneDnn instance;
  return instance;
}

void run(const GemmArgs& r, const void* a, const void* b, void* c, dt in, dt out) {
  OneDnn& d = onednn();
  const Matmul& mm = d.get(r, in, out);
  thread_local dnnl::stream stream{d.engine};
  thread_local std::vector<unsigned char> scratch;
  if (scratch.size() < mm.scratchpad.get_size()) scratch.resize(mm.scratchpad.get_size());
  std::unordered_map<int, dnnl::memory> args{
      {DNNL_ARG_SRC, dnnl::memory(mm.a, d.engine, const_cast<void*>(a))},
      {DNNL_ARG_WEIGHTS, dnnl::memory(mm.b, d.engine, const_cast<void*>(b))},
      {DNNL_ARG_DST, dnnl::memory(mm.c, d.engine, c)}};
  if (!scratch.empty())
    args.emplace(DNNL_ARG_SCRATCHPAD, dnnl::memory(mm.scratchpad, d.engine, scratch.data()));
  mm.primitive.execute(stream, args);
  stream.wait();
}

// An f32 C over a long inner dimension in chunks of k, added in order (beta 1 after the first).
// oneDNN's matmul runs a k much longer than the output's sides (the classifier's d x: k = the
// padded vocabulary, m x n = tokens x d_model) at about 2/3 of its rate at the model's other
// shapes (1 thread, CPU time: 146 against 220 GFLOP/s at m 1024, n 256, k 50304), and at their
// rate in chunks of about 8192 (221; bf16 operands 381 -> 420). The chunks depend on k alone:
// where oneDNN does not split a chunk's k over the threads itself (the model's sides, not thin
// products on its AVX2 kernel), the order of the sum does not depend on the thread count.
constexpr int64_t kLongK = 16384, kKChunk = 8192;

template <typename In>
void run_f32_out(const GemmArgs& r, const In* a, const In* b, float* c, dt in) {
  if (r.batch != 1 || r.k < kLongK || r.k < 8 * std::max(r.m, r.n)) {
    run(r, a, b, c, in, dt::f32);
    return;
  }
  const int64_t chunks = (r.k + kKChunk - 1) / kKChunk, step = (r.k + chunks - 1) / chunks;
  for (int64_t k0 = 0; k0 < r.k; k0 += step) {
    GemmArgs part = r;
    part.k = std::min(step, r.k - k0);
    if (k0 > 0) part.beta = 1.0f;
    // op(A)'s columns k0.. and op(B)'s rows k0.. (row-major; a transposed operand stores them
    // as rows of A, columns of B).
    run(part, a + (r.trans_a ? k0 * r.lda : k0), b + (r.trans_b ? k0 : k0 * r.ldb), c, in, dt::f32);
  }
}

}  // namespace

void onednn_gemm(const GemmArgs& r, const float* a, const float* b, float* c) {
  run_f32_out(r, a, b, c, dt::f32);
}

void onednn_gemm(const GemmArgs& r, const bf16* a, const bf16* b, float* c) {
  run_f32_out(r, a, b, c, dt::bf16);
}

void onednn_gemm(const GemmArgs& r, const bf16* a, const bf16* b, bf16* c) {
  ENGINE_CHECK(r.beta == 0.0f, "gemm with a bf16 C: beta must be 0 (C is written, not read)");
  run(r, a, b, c, dt::bf16, dt::bf16);
}

std::string onednn_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "isa " + std::to_string(static_cast<int>(dnnl::get_effective_cpu_isa()));
  }
}

}  // namespace core::cpu
