// optim_replay: replays a golden optimizer trajectory through the registry's optimizers and
// reports, per step and parameter, the largest absolute and relative difference; exits non-zero
// above the file's suggested_atol. Under mpirun every optimizer gets the placement it asks for.
// --bench instead times one optimizer step of the default CPU model's parameters.
//
//   optim_replay GOLDEN.safetensors [--optimizer NAME] [--set key=value]... [--steps N] [--json]
//                [--quiet]
//   optim_replay --bench [--preset FILE] [--layers 4] [--d-model 256] [--vocab 50304]
//                [--repeat 5] [--json]
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "apps/optim_replay/bench.h"
#include "apps/optim_replay/golden_case.h"
#include "apps/optim_replay/osft_case.h"
#include "comm/abort.h"
#include "comm/communicator.h"
#include "comm/mpi_session.h"
#include "core/check.h"

namespace {

struct Args {
  std::string file;
  std::string optimizer;
  std::vector<std::string> sets;
  bool json = false;
  bool quiet = false;
  bool bench = false;
  int64_t steps = 0;  // 0: every step of the file
  replay::BenchOptions bench_options;
};

Args parse_args(int argc, char** argv) {
  Args a;
  auto value = [&](int& i) -> std::string {
    ENGINE_CHECK(i + 1 < argc, std::string("optim_replay: ") + argv[i] + " needs a value");
    return argv[++i];
  };
  auto integer = [&](int& i) -> int64_t {
    const std::string flag = argv[i];
    const std::string v = value(i);
    try {
      return std::stoll(v);
    } catch (const std::exception&) {
      ENGINE_FAIL("optim_replay: " + flag + " expects an integer, got '" + v + "'");
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--optimizer")
      a.optimizer = value(i);
    else if (arg == "--set")
      a.sets.push_back(value(i));
    else if (arg == "--json")
      a.json = true;
    else if (arg == "--quiet")
      a.quiet = true;
    else if (arg == "--steps")
      a.steps = integer(i);
    else if (arg == "--bench")
      a.bench = true;
    else if (arg == "--preset")
      a.bench_options.preset = value(i);
    else if (arg == "--layers")
      a.bench_options.layers = integer(i);
    else if (arg == "--d-model")
      a.bench_options.d_model = integer(i);
    else if (arg == "--vocab")
      a.bench_options.vocab = integer(i);
    else if (arg == "--repeat")
      a.bench_options.repeat = static_cast<int>(integer(i));
    else if (!arg.starts_with("--") && a.file.empty())
      a.file = arg;
    else
      ENGINE_FAIL("optim_replay: unknown argument '" + arg + "'");
  }
  ENGINE_CHECK(a.bench || !a.file.empty(),
               "usage: optim_replay GOLDEN.safetensors [--optimizer NAME] [--set key=value]... "
               "[--json] [--quiet] | optim_replay --bench [--json]");
  return a;
}

// A difference as a JSON value: null when it is not finite (a NaN or infinite parameter).
std::string json_number(double x) {
  if (!std::isfinite(x)) return "null";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6e", x);
  return buf;
}

int replay_main(const Args& args, comm::Communicator& comm) {
  if (replay::is_osft_golden(args.file)) {
    ENGINE_CHECK(args.optimizer.empty() && args.steps == 0,
                 "optim_replay: --optimizer and --steps do not apply to " + args.file);
    return replay::osft_main(args.file, args.sets, args.json, args.quiet, comm);
  }
  replay::GoldenCase golden = replay::load_golden(args.file, args.optimizer, args.sets);
  replay::truncate_steps(golden, args.steps);
  replay::Replayer replayer(golden, comm);
  const std::vector<replay::Difference> diffs = replayer.run();
  const replay::Difference worst = replay::worst_difference(diffs);
  const bool pass = replay::passes(worst, golden.suggested_atol);
  if (comm.rank() != 0) return pass ? 0 : 1;
  const std::string what =
      golden.orthogonalizer.empty() ? golden.reference_optimizer : golden.orthogonalizer;
  if (args.json) {
    for (const auto& d : diffs)
      std::printf(
          "{\"file\":\"%s\",\"np\":%d,\"step\":%lld,\"param\":\"%s\",\"max_abs\":%s,"
          "\"max_rel\":%s}\n",
          golden.path.c_str(), comm.size(), static_cast<long long>(d.step), d.param.c_str(),
          json_number(d.max_abs).c_str(), json_number(d.max_rel).c_str());
    std::printf(
        "{\"file\":\"%s\",\"np\":%d,\"optimizer\":\"%s\",\"worst_max_abs\":%s,"
        "\"suggested_atol\":%.6e,\"pass\":%s}\n",
        golden.path.c_str(), comm.size(), what.c_str(), json_number(worst.max_abs).c_str(),
        golden.suggested_atol, pass ? "true" : "false");
    return pass ? 0 : 1;
  }
  if (!args.quiet) {
    std::printf("%-5s %-34s %-12s %-12s\n", "step", "parameter", "max_abs", "max_rel");
    for (const auto& d : diffs)
      std::printf("%-5lld %-34s %-12.3e %-12.3e%s\n", static_cast<long long>(d.step),
                  d.param.c_str(), d.max_abs, d.max_rel,
                  replay::passes(d, golden.suggested_atol) ? "" : "  ABOVE atol");
  }
  std::printf("%s: %s np=%d worst max_abs %.3e (step %lld, %s) vs suggested_atol %.3e: %s\n",
              golden.path.c_str(), what.c_str(), comm.size(), worst.max_abs,
              static_cast<long long>(worst.step), worst.param.c_str(), golden.suggested_atol,
              pass ? "PASS" : "FAIL");
  return pass ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  comm::MpiSession session(&argc, &argv);
  return comm::run_guarded([&] {
    const Args args = parse_args(argc, argv);
    std::unique_ptr<comm::Communicator> world = comm::make_mpi_world();
    int rc = args.bench ? replay::bench_main(args.bench_options, args.json, *world)
                        : replay_main(args, *world);
    // Every rank agrees on the exit code.
    int64_t worst = rc;
    world->all_reduce(&worst, 1, comm::ReduceOp::Max);
    return static_cast<int>(worst);
  });
}
