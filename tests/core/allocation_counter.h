// The test binary's global operator new counts every allocation (allocation_counter.cpp), so
// that a test can see that code it runs allocates nothing. Defined in a translation unit of its
// own: inlined into callers, the replaced operators trip GCC's -Wmismatched-new-delete.
#pragma once

namespace test_util {

long allocations();  // operator new calls so far, every thread

}  // namespace test_util
