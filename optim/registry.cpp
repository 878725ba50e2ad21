#include "optim/registry.h"

#include "core/check.h"
#include "optim/adamw/adamw.h"
#include "optim/muon/muon.h"
#include "optim/osft/osft.h"
#include "optim/soap/rekls.h"
#include "optim/soap/soap.h"
#include "optim/soap/tp_rekls.h"

namespace optim {

Registry& Registry::global() {
  static Registry* registry = [] {
    auto* r = new Registry;
    r->add("adamw", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<AdamW>(AdamWConfig::from_yaml(h));
    });
    r->add("muon", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Muon>(MuonConfig::from_yaml(h, MuonConfig{}));
    });
    r->add("normuon", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Muon>(MuonConfig::from_yaml(h, MuonConfig::normuon_defaults()),
                                    "normuon");
    });
    r->add("soap", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Soap>(SoapConfig::from_yaml(h, SoapConfig{}), "soap");
    });
    r->add("stacked_soap", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      SoapConfig defaults;  // the reference's fixed settings: KL factors, QR refresh
      defaults.use_kl_shampoo = true;
      return std::make_unique<Soap>(SoapConfig::from_yaml(h, defaults), "stacked_soap", true);
    });
    r->add("rekls", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Soap>(rekls_config(h), "rekls");
    });
    r->add("tp_rekls", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<TpRekls>(TpReklsConfig::from_yaml(h));
    });
    r->add("osft", [](HyperReader& h) -> std::unique_ptr<Optimizer> {
      return std::make_unique<Osft>(OsftConfig::from_yaml(h));
    });
    return r;
  }();
  return *registry;
}

void Registry::add(const std::string& name, OptimizerFactory factory) {
  ENGINE_CHECK(factories_.emplace(name, std::move(factory)).second,
               "optimizer registry: '" + name + "' registered twice");
}

std::vector<std::string> Registry::names() const {
  std::vector<std::string> out;
  for (const auto& kv : factories_)
    out.push_back(kv.first);
  return out;
}

std::unique_ptr<Optimizer> Registry::create(const std::string& name, HyperReader& reader) const {
  auto it = factories_.find(name);
  if (it == factories_.end()) {
    std::string known;
    for (const auto& n : names())
      known += (known.empty() ? "" : ", ") + n;
    reader.fail("optimizer", "names an unknown optimizer '" + name + "' (known: " + known + ")");
  }
  std::unique_ptr<Optimizer> opt = it->second(reader);
  reader.finish();
  return opt;
}

}  // namespace optim
