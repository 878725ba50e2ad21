// The OpenMP thread count for a scope: set on construction, the previous count restored on
// destruction (also when a failed ASSERT leaves the test early).
#pragma once

#include <omp.h>

namespace test_util {

class OmpThreads {
 public:
  explicit OmpThreads(int threads) : before_(omp_get_max_threads()) {
    omp_set_num_threads(threads);
  }
  ~OmpThreads() { omp_set_num_threads(before_); }
  OmpThreads(const OmpThreads&) = delete;
  OmpThreads& operator=(const OmpThreads&) = delete;

 private:
  int before_;
};

}  // namespace test_util
