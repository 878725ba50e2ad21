// The files one `tokenize` run owns under its output prefix, so that it never deletes or
// overwrites what it did not write.
//
// A run writes its shards PREFIX_000000.bin ... (or PREFIX_train_* and PREFIX_val_*) into a
// staging folder beside them (.BASE.tokenize.<pid>); only when it succeeds are they moved into
// place, and then the list PREFIX.tokenize.json names them with their sizes. That list is how a
// later run knows which files an earlier tokenize run of the prefix wrote: shards of the prefix
// that exist are refused, unless --overwrite is given and every one of them is listed at its
// listed size (no link); then the listed files are replaced and nothing else is touched. A run
// that fails leaves the folder as it was. An input that is one of these files (by name, glob,
// symbolic or hard link: the same device and inode) is refused.
#pragma once

#include <string>
#include <vector>

namespace data {

class ShardOutputs {
 public:
  // `prefix` is a path prefix (not empty, not ending in '/', not an existing folder); `inputs`
  // the expanded input paths ("-" for stdin). Throws core::Error naming the file when an input is
  // an output or existing files are in the way (see above). Creates the folder and the staging
  // folder.
  ShardOutputs(const std::string& prefix, const std::vector<std::string>& inputs, bool overwrite);
  ~ShardOutputs();  // a run that did not commit: its staging folder is removed
  ShardOutputs(const ShardOutputs&) = delete;
  ShardOutputs& operator=(const ShardOutputs&) = delete;

  // Where a ShardWriter writes the shards of `prefix` or `prefix` + "_train" / "_val" until
  // commit: the same name in the staging folder.
  std::string staged(const std::string& shard_prefix) const;
  // Moves every staged shard into place, removes the earlier run's listed files that the new
  // run did not write, then writes the list of the new run's files.
  void commit();

  // PREFIX.tokenize.json.
  static std::string list_path(const std::string& prefix);

 private:
  std::string folder_;                // where the shards go ("." for a bare prefix)
  std::string base_;                  // the file-name part of the prefix
  std::string staging_;               // folder_/.base_.tokenize.<pid>
  std::vector<std::string> earlier_;  // names of the earlier run's files that exist now
  bool committed_ = false;
};

}  // namespace data
