// The CPU backend: its device, memory and name; the ops are in one file per family (memory.cpp,
// gemm.cpp, elementwise.cpp, norms.cpp, embedding.cpp, attention.cpp, classifier.cpp, moe.cpp,
// reductions.cpp, linalg.cpp), each forwarding to the float instantiation of the templated
// kernels in <family>_kernels.h, cpu_gemm.h and cpu_linalg.h (which the tests also run in float64).
#include "core/cpu/cpu_backend.h"

#include <omp.h>

#include <string>

#include "core/cpu/cpu_isa.h"

namespace core {

Device CpuBackend::device() const {
  return Device::cpu();
}

Allocator& CpuBackend::allocator() {
  return cpu_allocator();
}

const char* CpuBackend::name() const {
  thread_local std::string name;
  name = "cpu (" + cpu::describe_cpu() + ", " + std::to_string(omp_get_max_threads()) + " threads)";
  return name.c_str();
}

void CpuBackend::synchronize() {}

Backend& cpu_backend() {
  static CpuBackend backend;
  return backend;
}

}  // namespace core
