// The clocks the benchmarks and timers read, in seconds: wall time (steady, for intervals) and
// CPU time of the whole process or of the calling thread (CPU / wall = the cores kept busy; a
// thread's CPU time measures its work independent of other load on the machine).
#pragma once

namespace core {

double wall_seconds();
double process_cpu_seconds();  // every thread of the process
double thread_cpu_seconds();   // the calling thread

}  // namespace core
