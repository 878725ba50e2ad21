// The documents `tokenize` reads: plain text files (one document each), JSON Lines (one document
// per line, the string under a key), directories (every file below, in sorted order), glob
// patterns and stdin ("-"). Each document's text is valid UTF-8 (checked, or repaired with
// U+FFFD when asked); errors name the file, and for JSON Lines the line.
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

namespace data {

struct TextInputOptions {
  std::string jsonl_key = "text";  // the key holding a JSON Lines document's text
  bool jsonl = false;              // read every input (stdin too) as JSON Lines, whatever its name
  bool replace_invalid = false;    // replace invalid UTF-8 with U+FFFD instead of failing
};

// The input files of command-line arguments, in order: "-" (stdin) as is; a directory as every
// regular file below it (hidden ones skipped), sorted by path; a path that does not exist but
// holds * ? or [ as the sorted files it matches. A missing path, a pattern matching nothing or
// an empty directory is an error naming it.
std::vector<std::string> expand_text_inputs(const std::vector<std::string>& args);

// Whether a path is read as JSON Lines: its name ends in .jsonl, or options.jsonl.
bool is_jsonl_input(const std::string& path, const TextInputOptions& options);

// A document as read: a plain-text file's checked text, or a JSON Lines line still to be decoded
// by DocumentReader::text (which may run on another thread: decoding is most of the reading).
struct RawDocument {
  std::string bytes;
  int jsonl_file = -1;  // index into the reader's paths for a JSON Lines line, else -1
  int64_t line = 0;     // its line number (from 1)
};

class DocumentReader {
 public:
  DocumentReader(std::vector<std::string> paths, TextInputOptions options);
  ~DocumentReader();

  // The next document; false after the last one.
  bool next(RawDocument& doc);
  // The document's text: a JSON Lines line must be an object with a string under the key
  // (blank lines are skipped by next). Thread-safe.
  std::string text(RawDocument&& doc) const;
  // Input bytes consumed so far, and the total size of the input files (0 when stdin is among
  // them: unknown).
  uint64_t bytes_read() const { return bytes_read_; }
  uint64_t total_bytes() const { return total_bytes_; }

 private:
  bool open_next_file();
  std::string checked(std::string text, const std::string& where) const;

  std::vector<std::string> paths_;
  TextInputOptions options_;
  size_t next_path_ = 0;
  std::string path_;  // the file being read
  std::unique_ptr<std::ifstream> file_;
  std::istream* in_ = nullptr;
  int64_t line_ = 0;
  uint64_t bytes_read_ = 0;
  uint64_t total_bytes_ = 0;
};

}  // namespace data
