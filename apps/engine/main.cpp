// engine: the MPI-launched training executable. Until the trainer lands (issue "The engine"),
// this prints its usage and the backend it would run on.
#include <cstdio>
#include <cstring>

#include "engine/core/backend.h"

static void print_usage() {
  std::printf(
      "usage: mpirun -np N engine --config configs/X.yaml [--set key=value ...]\n"
      "\n"
      "Trains a GPT with ZeRO-sharded state. The training loop is not built yet; this binary\n"
      "reports the compute backend it finds.\n"
      "\n"
      "options:\n"
      "  --help        this text\n");
}

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--help") == 0 || std::strcmp(argv[i], "-h") == 0) {
      print_usage();
      std::printf("\nbackend: %s; CUDA device present: %s\n", core::cpu_backend().name(),
                  core::cuda_available() ? "yes" : "no");
      return 0;
    }
  }
  print_usage();
  return 2;
}
