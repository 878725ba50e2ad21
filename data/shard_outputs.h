// The files one `tokenize` run owns under its output prefix, so that it never deletes or
// overwrites what it did not write.
//
// A run writes its shards PREFIX_000000.bin ... (or PREFIX_train_* and PREFIX_val_*) into a
// staging folder beside them (.BASE.tokenize.<pid>); only when it succeeds are they moved into
// place, and then the list PREFIX.tokenize.json names them with their sizes. That list is how a
// later run knows which files an earlier tokenize run of the prefix wrote: shards of the prefix
// that exist are refused, unless --overwrite is given and every one of them is listed at its
// listed size (no link); then the listed files are replaced and nothing else is touched. A run
// that fails leaves the folder as it was: the list is written in full before any shard moves,
// so a full disk stops the run there. An input that is one of these files (by name, glob,
// symbolic or hard link: the same device and inode) is refused.
//
// One run at a time per prefix: a run holds an flock on .BASE.tokenize.lock beside the shards
// from its first check to its commit, and a second run of the prefix is refused naming the lock
// and the process that holds it (two runs both succeeded, their shards mixed or one's replaced by
// the other's). The holder removes the lock file before it lets go, and a run that locked a file
// no longer at that name locks the one there now, so no two runs hold the prefix and the folder
// keeps no lock file after a run (a SIGKILLed run's stays until the next run of the prefix).
// Holding the lock, a run knows that every staging folder of the prefix is a killed run's
// (SIGKILL: no chance to clean up) and removes it.
#pragma once

#include <mutex>
#include <string>
#include <vector>

namespace data {

class ShardOutputs {
 public:
  // `prefix` is a path prefix (not empty, not ending in '/', not an existing folder); `inputs`
  // the expanded input paths ("-" for stdin). Throws core::Error naming the file when an input is
  // an output, existing files are in the way or another run holds the prefix (see above). Creates
  // the folder, takes the lock, removes killed runs' staging folders and creates this run's.
  ShardOutputs(const std::string& prefix, const std::vector<std::string>& inputs, bool overwrite);
  ~ShardOutputs();  // a run that did not commit: its staging folder is removed
  ShardOutputs(const ShardOutputs&) = delete;
  ShardOutputs& operator=(const ShardOutputs&) = delete;

  // Where a ShardWriter writes the shards of `prefix` or `prefix` + "_train" / "_val" until
  // commit: the same name in the staging folder.
  std::string staged(const std::string& shard_prefix) const;
  // Writes the list of the new run's files (not yet in place), moves every staged shard into
  // place, removes the earlier run's listed files that the new run did not write, then renames
  // the list into place.
  void commit();
  // Removes the staging folder unless the outputs are committed, lets go of the lock and makes a
  // later commit() fail: what a stop signal does (from another thread; waits for a commit under
  // way to end).
  void abandon();

  // The staging folders (and list temporaries) of killed runs of this prefix that the
  // constructor removed.
  const std::vector<std::string>& removed_stale() const { return stale_; }

  // PREFIX.tokenize.json.
  static std::string list_path(const std::string& prefix);
  // .BASE.tokenize.lock beside the shards.
  static std::string lock_path(const std::string& prefix);

 private:
  // The checks above, the removal of killed runs' leftovers and the staging folder: all under the
  // lock.
  void prepare(const std::string& prefix, const std::vector<std::string>& inputs, bool overwrite);

  std::string folder_;                // where the shards go ("." for a bare prefix)
  std::string base_;                  // the file-name part of the prefix
  std::string staging_;               // folder_/.base_.tokenize.<pid>
  std::vector<std::string> earlier_;  // names of the earlier run's files that exist now
  std::vector<std::string> stale_;    // killed runs' leftovers removed
  std::string lock_path_;
  int lock_fd_ = -1;
  std::mutex mutex_;  // commit() against abandon()
  bool committed_ = false;
  bool abandoned_ = false;
};

}  // namespace data
