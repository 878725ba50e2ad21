#include "core/cpu/onednn_gemm.h"

#include <map>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <tuple>

#include "core/check.h"

namespace core::cpu {

namespace {

using dims = dnnl::memory::dims;

// Everything a matmul primitive is made for (the last: C is bf16).
using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                       int64_t, int64_t, int64_t, float, float, bool>;

struct Matmul {
  dnnl::memory::desc a, b, c;
  dnnl::matmul primitive;
};

// One operand's descriptor: [batch,] rows x cols, row-major with leading dimension ld, or the
// transpose of such a matrix; a batch stride of 0 broadcasts one matrix to every member.
dnnl::memory::desc operand(dnnl::memory::data_type type, bool trans, int64_t rows, int64_t cols,
                           int64_t ld, int64_t batch, int64_t stride) {
  const dims row_col = trans ? dims{1, ld} : dims{ld, 1};
  if (batch == 1) return dnnl::memory::desc(dims{rows, cols}, type, row_col);
  const int64_t members = stride == 0 ? 1 : batch;
  return dnnl::memory::desc(dims{members, rows, cols}, type,
                            dims{stride == 0 ? rows * cols : stride, row_col[0], row_col[1]});
}

struct OneDnn {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::mutex mutex;
  std::map<Key, Matmul> primitives;

  const Matmul& get(const GemmArgs& r, bool bf16_out) {
    const Key key{r.trans_a, r.trans_b,  r.m,        r.n,        r.k,     r.lda,  r.ldb,   r.ldc,
                  r.batch,   r.stride_a, r.stride_b, r.stride_c, r.alpha, r.beta, bf16_out};
    auto it = primitives.find(key);
    if (it != primitives.end()) return it->second;
    using dt = dnnl::memory::data_type;
    Matmul mm;
    mm.a = operand(dt::bf16, r.trans_a, r.m, r.k, r.lda, r.batch, r.stride_a);
    mm.b = operand(dt::bf16, r.trans_b, r.k, r.n, r.ldb, r.batch, r.stride_b);
    // A bf16 C is the f32 accumulation rounded once as it is stored: kmath's rounding of the
    // f32 C oneDNN computes (nearest even), which flushes sums below 2^-126 to zero in both.
    mm.c = operand(bf16_out ? dt::bf16 : dt::f32, false, r.m, r.n, r.ldc, r.batch, r.stride_c);
    dnnl::primitive_attr attr;
    if (r.alpha != 1.0f) attr.set_output_scales(0, {r.alpha});
    if (r.beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(r.beta);  // C = alpha A B + beta C
      attr.set_post_ops(ops);
    }
    try {
      const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(mm.a, mm.b, mm.c), attr, engine);
      mm.primitive = dnnl::matmul(pd);
    } catch (const dnnl::error& e) {
      ENGINE_FAIL("bf16 gemm(m=" + std::to_string(r.m) + ", n=" + std::to_string(r.n) +
                  ", k=" + std::to_string(r.k) + ", batch=" + std::to_string(r.batch) +
                  "): oneDNN has no matmul for it: " + e.what());
    }
    return primitives.emplace(key, std::move(mm)).first->second;
  }
};

OneDnn& onednn() {
  static OneDnn instance;
  return instance;
}

void run(const GemmArgs& r, const bf16* a, const bf16* b, void* c, bool bf16_out) {
  OneDnn& d = onednn();
  std::lock_guard<std::mutex> lock(d.mutex);
  const Matmul& mm = d.get(r, bf16_out);
  dnnl::memory am(mm.a, d.engine, const_cast<bf16*>(a));
  dnnl::memory bm(mm.b, d.engine, const_cast<bf16*>(b));
  dnnl::memory cm(mm.c, d.engine, c);
  mm.primitive.execute(d.stream, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
  d.stream.wait();
}

}  // namespace

void onednn_gemm(const GemmArgs& r, const bf16* a, const bf16* b, float* c) {
  run(r, a, b, c, false);
}

void onednn_gemm(const GemmArgs& r, const bf16* a, const bf16* b, bf16* c) {
  ENGINE_CHECK(r.beta == 0.0f, "gemm with a bf16 C: beta must be 0 (C is written, not read)");
  run(r, a, b, c, true);
}

}  // namespace core::cpu
