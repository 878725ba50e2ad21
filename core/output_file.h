// The one way the tools write their files: tokenize's shards and file list, `engine export`'s
// weights, a run's log.txt, config.yaml, trace.json, metrics.jsonl, TensorBoard events and lock
// files. Never through a symbolic link, never over something that is not a regular file, never
// into a file that another name shares. A link planted at such a name (log.txt -> ~/.bashrc, a
// temporary name) was followed and the file it named replaced; `engine export --out /dev/null`
// as root replaced the system's /dev/null with a regular file.
//
// Two ways to write:
// - in place (open_output_file): a file kept open and appended to or rewritten (log.txt,
//   metrics.jsonl, the event file, a lock file). O_NOFOLLOW refuses a link in the open itself, so
//   one planted after any check is refused too; a FIFO, folder, socket or block device is refused
//   (a character device such as /dev/null is let through: writes go to the device, nothing is
//   replaced). A regular file that other hard links share (a `cp -al` snapshot of the folder) is
//   first replaced by a copy of its own, so the other names keep what they held.
// - whole (AtomicFile, write_output_file): to a temporary name in the target's folder, created
//   with O_EXCL under an unpredictable suffix (.NAME.<16 hex digits>: no name to plant a link at in
//   advance), flushed to disk, and renamed over the target only after checking again that the
//   target is nothing or a regular file. A reader never sees a partial file; a failed write (a
//   full disk) leaves the target as it was; neither a link nor a device nor a folder is replaced.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace core {

// Whether a regular file at `path` may be a character device too: for files written in place
// (writes to /dev/null go to the device); never for files renamed into place (the rename would
// replace the device).
enum class DeviceTarget { Refused, Allowed };

// Throws core::Error naming `what` ("the log file"), the path and what is there ("is a symbolic
// link (to X)", "is not a regular file (it is a FIFO)") when `path` exists and is neither a
// regular file nor, where `devices` allows, a character device. Nothing there passes. The check
// made once before a run starts; the writers below make it again at the moment they write.
void check_output_file(const std::string& path, const std::string& what,
                       DeviceTarget devices = DeviceTarget::Refused);

// What open_output_file does with a regular file that other hard links share.
enum class SharedFile {
  Copy,    // replaced by a copy of its own (content kept unless O_TRUNC), the others untouched
  Refuse,  // refused naming the file (a lock file: two names of one lock would lock each other)
};

// open(2) of `path` with O_NOFOLLOW | O_CLOEXEC added to `flags` (mode 0644 when created), the
// target as described above (regular file or character device). O_TRUNC is applied only after
// the checks, so a shared file is never truncated. Throws core::Error naming `what` and the path
// when the path is a link, of a refused kind, shared and `shared` is Refuse, or cannot be opened.
// Returns the descriptor.
int open_output_file(const std::string& path, int flags, const std::string& what,
                     SharedFile shared = SharedFile::Copy);

// A file written whole and renamed into place by commit(); the temporary file is removed when
// the object goes without commit (an error, an exception).
class AtomicFile {
 public:
  // Creates the temporary file beside `path` (its folder must exist); throws naming `what` and
  // `path` when `path` is a link or not a regular file, or the folder cannot take a new file.
  AtomicFile(std::string path, std::string what);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Appends `bytes` bytes; throws naming `what` and the path (a full disk: "No space left on
  // device") and removes the temporary file.
  void write(const void* data, size_t bytes);
  // Flushes what is written to disk now, for a writer that must know the bytes are there before
  // it moves other files (commit flushes too); throws as write() does.
  void sync();
  // Flushes to disk, checks the target again and renames the file over it; throws as write()
  // does, leaving the target as it was.
  void commit();

  const std::string& temporary_path() const { return tmp_; }

 private:
  [[noreturn]] void fail(const std::string& why);

  std::string path_, what_, tmp_;
  int fd_ = -1;
};

// Writes `text` as the whole file at `path` through an AtomicFile.
void write_output_file(const std::string& path, std::string_view text, const std::string& what);

}  // namespace core
