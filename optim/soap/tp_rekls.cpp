#include "optim/soap/tp_rekls.h"

#include "core/check.h"
#include "optim/soap/rekls.h"

namespace optim {

TpReklsConfig TpReklsConfig::from_yaml(HyperReader& r) {
  TpReklsConfig c;
  const std::string pd = r.string("partition_dim", "none");
  if (pd == "0" || pd == "1")
    c.partition_dim = pd == "0" ? 0 : 1;
  else if (pd != "none")
    r.fail("partition_dim", "must be 0 (rows), 1 (columns) or none (replicated), got '" + pd + "'");
  c.distributed_eigh = r.boolean("distributed_eigh", c.distributed_eigh);
  c.soap = rekls_config(r, true);
  return c;
}

TpRekls::TpRekls(const TpReklsConfig& config)
    : config_(config),
      update_config_(config.soap),
      slots_("tp_rekls", {"exp_avg", "exp_avg_sq", "factor_left", "factor_right"}, {"step"}) {
  update_config_.weight_decay = 0;  // applied to the local part before the gather
}

comm::Placement TpRekls::placement() const {
  return config_.partition_dim < 0 ? comm::Placement::replicate()
                                   : comm::Placement::shard(config_.partition_dim);
}

void TpRekls::check_param(const std::string& name, const core::Shape& shape) const {
  ENGINE_CHECK(shape.size() == 2, "tp_rekls: parameter '" + name + "' " + core::shape_str(shape) +
                                      " is not a matrix; route it to adamw");
}

std::optional<StateLayout> TpRekls::state_layout(const std::string& /*param*/,
                                                 const std::string& slot,
                                                 const core::Shape& full_shape, int rank,
                                                 int world) const {
  if (full_shape.size() != 2) return std::nullopt;
  const int64_t m = full_shape[0], n = full_shape[1];
  if (slot == "exp_avg" || slot == "exp_avg_sq") return StateLayout::whole({m, n});
  if (slot != "factor_left" && slot != "factor_right") return std::nullopt;
  const int64_t k = slot == "factor_left" ? m : n;
  if (config_.partition_dim < 0) return StateLayout::whole({k, k});
  return StateLayout::part({k, k}, 0, rank, world);
}

namespace {

// A copy of t in the backend's memory.
core::Tensor copy_of(core::Backend& backend, const core::Tensor& t) {
  core::Tensor c = backend_tensor(backend, t.shape());
  backend.copy(c.data<float>(), t.data<float>(), t.nbytes());
  return c;
}

// The concatenation along `dim` of every rank's equal part `local` [rows, cols] of a [m, n]
// matrix (dim 0: parts stacked by rows; dim 1: side by side).
core::Tensor gather_matrix(core::Backend& backend, comm::Communicator& comm,
                           const core::Tensor& local, int dim, int64_t m, int64_t n) {
  const int ws = comm.size();
  std::vector<int64_t> counts(static_cast<size_t>(ws), local.numel());
  core::Tensor full = backend_tensor(backend, {m, n});
  if (dim == 0) {
    comm.all_gather(local.data<float>(), full.data<float>(), counts);
    return full;
  }
  const int64_t nl = n / ws;
  core::Tensor blocks = backend_tensor(backend, {ws * m * nl});
  comm.all_gather(local.data<float>(), blocks.data<float>(), counts);
  for (int r = 0; r < ws; ++r)
    backend.copy_block_2d(full.data<float>() + r * nl, n, blocks.data<float>() + r * m * nl, nl, m,
                          nl);
  return full;
}

// dst [rows, cols] <- rows [row0, row0 + rows) and columns [col0, col0 + cols) of src [., n].
void copy_block(core::Backend& backend, const float* src, int64_t n, int64_t row0, int64_t rows,
                int64_t col0, int64_t cols, float* dst) {
  backend.copy_block_2d(dst, cols, src + row0 * n + col0, n, rows, cols);
}

}  // namespace

void TpRekls::step(std::span<const ParamShard> params, const StepContext& ctx) {
  core::Backend& backend = backend_of(ctx);
  const int pd = config_.partition_dim;
  ENGINE_CHECK(pd < 0 || ctx.comm,
               "tp_rekls: a sharded group needs the shard group's "
               "communicator in the step context");
  comm::Communicator* group = pd < 0 ? nullptr : ctx.comm;
  ENGINE_CHECK(!group || group->device() == backend.device(),
               "tp_rekls: the shard group's communicator moves " + group->device().str() +
                   " buffers but the parameters are on " + backend.device().str() + " (backend " +
                   backend.name() + ")");
  const int ws = group ? group->size() : 1;
  const int rank = group ? group->rank() : 0;
  comm::Communicator* distribute =
      config_.distributed_eigh && ctx.comm && ctx.comm->size() > 1 ? ctx.comm : nullptr;
  const double lr = config_.soap.lr * ctx.lr_scale;
  const SoapConfig& c = config_.soap;

  struct Full {
    const ParamShard* p;
    int64_t m, n;
    core::Tensor g, lf, rf, ql, lam_l, qr, lam_r;
    core::Tensor *l_local, *r_local;
  };
  std::vector<Full> fs;
  fs.reserve(params.size());
  RefreshBatch previous;  // eigh #1: the eigen data REKLS would have stored a step before
  for (const ParamShard& p : params) {
    check_shard(p, "tp_rekls");
    check_param(p.name, p.full_shape);
    const int64_t m = p.full_shape[0], n = p.full_shape[1];
    const std::string what =
        "tp_rekls: parameter '" + p.name + "' " + core::shape_str(p.full_shape);
    if (group) {
      ENGINE_CHECK(m % ws == 0 && n % ws == 0,
                   what + " is Shard(" + std::to_string(pd) + ") over " + std::to_string(ws) +
                       " ranks, but both of its dimensions must divide by the group size (L and "
                       "R are sharded by rows)");
      const int64_t part = p.full_shape[pd] / ws;
      ENGINE_CHECK(p.value.size(pd) == part && p.begin == rank * part,
                   what + ": rank " + std::to_string(rank) + " holds " + p.value.str() + " from " +
                       std::to_string(p.begin) + ", not the equal part " +
                       std::to_string(rank * part));
    } else {
      ENGINE_CHECK(p.value.shape() == p.full_shape, what + " must be whole, got " + p.value.str());
    }
    Full f{&p, m, n, {}, {}, {}, {}, {}, {}, {}, nullptr, nullptr};
    f.l_local = &slots_.tensor(p.name, "factor_left", {m / ws, m}, backend);
    f.r_local = &slots_.tensor(p.name, "factor_right", {n / ws, n}, backend);
    core::Tensor g = copy_of(backend, p.grad);
    float* w = p.value.data<float>();
    const int64_t local = p.value.numel();
    // Weight decay on the local part first (l2 enters the gradient that L and R see).
    if (c.weight_decay != 0) {
      if (c.weight_decay_method == WeightDecayMethod::L2) {
        backend.add_scaled(g.data<float>(), static_cast<float>(c.weight_decay), w, local);
      } else {
        backend.add_scaled(w, static_cast<float>(c.decay_alpha(lr)), w, local);
      }
    }
    if (group) {
      f.g = gather_matrix(backend, *group, g, pd, m, n);
      f.lf = gather_matrix(backend, *group, *f.l_local, 0, m, m);
      f.rf = gather_matrix(backend, *group, *f.r_local, 0, n, n);
    } else {
      f.g = std::move(g);
      f.lf = copy_of(backend, *f.l_local);
      f.rf = copy_of(backend, *f.r_local);
    }
    f.ql = backend_tensor(backend, {m, m});
    f.lam_l = backend_tensor(backend, {m});
    f.qr = backend_tensor(backend, {n, n});
    f.lam_r = backend_tensor(backend, {n});
    fs.push_back(std::move(f));
  }
  const auto canonicalize_bases = [&] {
    PhaseTimer timer(times_, backend, SoapPhase::Sort);
    for (Full& f : fs) {
      backend.canonicalize_column_signs(f.ql.data<float>(), f.m, f.m);
      backend.canonicalize_column_signs(f.qr.data<float>(), f.n, f.n);
    }
  };
  for (Full& f : fs) {
    if (slots_.counter(f.p->name, "step") == 0) {
      // Before the first step the eigen data is REKLS's initial state, identity bases and zero
      // eigenvalues, not an eigh of the zero factors (which orders the identity's columns
      // backwards: the KL statistics would add the same terms in another order).
      backend.set_identity(f.ql.data<float>(), f.m);
      backend.set_identity(f.qr.data<float>(), f.n);
      backend.fill_zero(f.lam_l.data<float>(), f.lam_l.nbytes());
      backend.fill_zero(f.lam_r.data<float>(), f.lam_r.nbytes());
      continue;
    }
    previous.add({f.lf.data<float>(), f.ql.data<float>(), f.lam_l.data<float>(), f.m, true, false});
    previous.add({f.rf.data<float>(), f.qr.data<float>(), f.lam_r.data<float>(), f.n, true, false});
  }
  SoapUpdate update(update_config_, backend, times_);
  previous.run(backend, update.ops(), 1, c.batched_refresh, distribute, times_);
  // The moments live in the basis of the stored factors, recomputed here every step: one sign per
  // eigenvector, the same whichever device (LAPACK, cuSOLVER) solved it, so that state saved on
  // one device resumes on another. A sign flip is exact, so the trajectory is unchanged.
  canonicalize_bases();

  // The REKLS update of the full matrices, identical on every rank.
  std::vector<SoapMatrix> xs(fs.size());
  RefreshBatch refresh;
  for (size_t i = 0; i < fs.size(); ++i) {
    Full& f = fs[i];
    SoapMatrix& x = xs[i];
    x.name = f.p->name;
    x.m = f.m;
    x.n = f.n;
    x.grad = f.g;
    x.exp_avg = &slots_.tensor(x.name, "exp_avg", {f.m, f.n}, backend);
    x.exp_avg_sq = &slots_.tensor(x.name, "exp_avg_sq", {f.m, f.n}, backend);
    x.factor[0] = &f.lf;
    x.factor[1] = &f.rf;
    x.basis[0] = &f.ql;
    x.basis[1] = &f.qr;
    x.eigenvalues[0] = &f.lam_l;
    x.eigenvalues[1] = &f.lam_r;
    x.step = &slots_.counter(x.name, "step");
  }
  update.collect(xs, refresh);
  refresh.run(backend, update.ops(), 1, c.batched_refresh, distribute, times_);
  canonicalize_bases();
  const float step = static_cast<float>(-lr);
  for (size_t i = 0; i < fs.size(); ++i) {
    Full& f = fs[i];
    SoapMatrix& x = xs[i];
    update.finish(x);
    // Keep this rank's rows of L and R, and its part of the update.
    copy_block(backend, f.lf.data<float>(), f.m, rank * (f.m / ws), f.m / ws, 0, f.m,
               f.l_local->data<float>());
    copy_block(backend, f.rf.data<float>(), f.n, rank * (f.n / ws), f.n / ws, 0, f.n,
               f.r_local->data<float>());
    const core::Tensor& v = f.p->value;
    core::Tensor d = backend_tensor(backend, v.shape());
    if (pd == 1)
      copy_block(backend, x.update.data<float>(), f.n, 0, f.m, rank * (f.n / ws), f.n / ws,
                 d.data<float>());
    else
      copy_block(backend, x.update.data<float>(), f.n, group ? rank * (f.m / ws) : 0, v.size(0), 0,
                 f.n, d.data<float>());
    backend.add_scaled(v.data<float>(), step, d.data<float>(), v.numel());
  }
}

}  // namespace optim
