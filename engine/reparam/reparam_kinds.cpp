#include "engine/reparam/reparam_kinds.h"

#include "engine/reparam/osft_reparam.h"

namespace engine {

namespace {

// The kinds of reparametrisation: one line each.
struct Kind {
  std::unique_ptr<Reparam> (*create)(const ReparamSetup& setup);  // null: the config asks none
  core::Tensor (*dense_from_checkpoint)(const CheckpointReader& reader, const std::string& param,
                                        const core::Shape& shape, core::Backend& backend);
};
constexpr Kind kKinds[] = {
    {&OsftReparam::create, &OsftReparam::dense_from_checkpoint},
};

}  // namespace

std::vector<std::unique_ptr<Reparam>> make_reparams(const ReparamSetup& setup) {
  std::vector<std::unique_ptr<Reparam>> out;
  for (const Kind& kind : kKinds)
    if (std::unique_ptr<Reparam> r = kind.create(setup)) out.push_back(std::move(r));
  return out;
}

core::Tensor dense_weight_from_checkpoint(const CheckpointReader& reader, const std::string& param,
                                          const core::Shape& shape, core::Backend& backend) {
  for (const Kind& kind : kKinds)
    if (core::Tensor w = kind.dense_from_checkpoint(reader, param, shape, backend); w.defined())
      return w;
  return {};
}

}  // namespace engine
