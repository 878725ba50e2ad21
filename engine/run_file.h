// Opening the files a run writes in its own folders (log.txt, config.yaml, metrics.jsonl in
// log.dir; .engine.lock in log.dir and checkpoint.dir): never through a symbolic link, never a
// FIFO, folder, socket or block device (a character device such as /dev/null is let through). A
// link planted there (log.txt -> ~/.bashrc) was followed, and the file it named replaced by the
// run's log.
#pragma once

#include <string>

namespace engine {

// open(2) of `path` with O_NOFOLLOW | O_CLOEXEC added to `flags` (mode 0644 when created); the
// link is refused in the open itself, so one planted after a check is refused too. Throws
// core::Error naming `what` ("the log file"), the path and, for a link, its target, when the path
// is a symbolic link or of a kind refused above, or cannot be opened. Returns the descriptor.
int open_run_file(const std::string& path, int flags, const std::string& what);

// Writes `text` as the whole of the file at `path` (created, or truncated: through
// open_run_file); throws naming `what` and the path when that fails.
void write_run_file(const std::string& path, const std::string& text, const std::string& what);

// Throws as open_run_file would, without opening anything, when `path` exists and is a symbolic
// link or of a kind refused above: the check made once, on rank 0, before a run starts.
void check_run_file(const std::string& path, const std::string& what);

}  // namespace engine
