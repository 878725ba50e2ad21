#include "model/layers/stream_mix.h"

#include <string>
#include <utility>

#include "core/check.h"

namespace model {

CoefOf scalar_param(size_t param, int element) {
  return [param, element](const Context& ctx, bool grads) {
    return CoefView{ctx.params.value(param) + element,
                    grads ? ctx.params.grad_of(param) + element : nullptr, 0};
  };
}

CoefOf column_of(const CoefficientMlp& producer, int column) {
  return [&producer, column](const Context&, bool) { return producer.view().column(column); };
}

StreamMix::StreamMix(std::vector<MixTerm> terms) : terms_(std::move(terms)) {
  ENGINE_CHECK(!terms_.empty(), "StreamMix: no terms");
  for (size_t i = 1; i < terms_.size(); ++i)
    ENGINE_CHECK(
        static_cast<bool>(terms_[i].coef),
        "StreamMix: term " + std::to_string(i) + " has no coefficient (only the first may be 1)");
}

void StreamMix::plan(ActivationPlan& plan, const Context& ctx) {
  out_ = plan.stream(ctx.N() * ctx.config.d_model);
}

Stream StreamMix::forward(Context& ctx, Stream x) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  core::Backend& be = ctx.backend;
  in_ = x;
  auto scalar = [](const CoefView& c) { return !c.defined() || c.stride == 0; };
  for (size_t i = 0; i < terms_.size(); ++i) {
    const MixTerm& t = terms_[i];
    const CoefView c = t.coef ? t.coef(ctx, false) : CoefView{};
    const Stream src = t.source ? t.source->stream() : x;
    const bool first = i == 0;
    if (first && terms_.size() > 1 && scalar(c)) {
      // Two scalar terms first: one pass, one rounding of a bf16 stream.
      const MixTerm& u = terms_[1];
      const CoefView cu = u.coef(ctx, false);
      if (scalar(cu)) {
        mix_stream(be, out_, c.values, src, cu.values, u.source ? u.source->stream() : x, N * D);
        ++i;
        continue;
      }
    }
    if (c.defined() && c.stride > 0) {
      if (out_.bf16) {
        be.row_scale_add(out_.bf16, c.values, c.stride, src.bf16, N, D, !first);
      } else {
        be.row_scale_add(out_.f32, c.values, c.stride, src.f32, N, D, !first);
      }
    } else if (first) {
      mix_stream(be, out_, c.values, src, nullptr, Stream{}, N * D);  // out = c s (or s)
    } else {
      mix_stream(be, out_, nullptr, out_, c.values, src, N * D);  // out += c s
    }
  }
  return out_;
}

void StreamMix::backward(Context& ctx) {
  const int64_t N = ctx.N(), D = ctx.config.d_model;
  core::Backend& be = ctx.backend;
  // d (the chain's stream) into dmix, which becomes dres.
  be.fill_zero(ctx.dmix, N * D * sizeof(float));
  for (const MixTerm& t : terms_) {
    const CoefView c = t.coef ? t.coef(ctx, true) : CoefView{};
    const Stream src = t.source ? t.source->stream() : in_;
    float* dsrc = t.source ? t.source->grad() : ctx.dmix;
    if (c.defined() && c.stride > 0) {
      if (src.bf16) {
        be.row_scale_add_backward(dsrc, c.grads, c.values, c.stride, src.bf16, ctx.dres, N, D);
      } else {
        be.row_scale_add_backward(dsrc, c.grads, c.values, c.stride, src.f32, ctx.dres, N, D);
      }
    } else {
      mix_stream_backward(be, dsrc, nullptr, c.grads, nullptr, c.values, src, nullptr, Stream{},
                          ctx.dres, N * D);
    }
  }
  std::swap(ctx.dmix, ctx.dres);
}

}  // namespace model
