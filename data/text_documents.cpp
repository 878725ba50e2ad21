#include "data/text_documents.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <sstream>

#include "core/check.h"
#include "core/json.h"
#include "data/utf8.h"

namespace data {

namespace {

namespace fs = std::filesystem;

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  std::vector<std::string> out;
  if (rc == 0) {
    for (size_t i = 0; i < g.gl_pathc; ++i)
      if (fs::is_regular_file(g.gl_pathv[i])) out.emplace_back(g.gl_pathv[i]);
  }
  ::globfree(&g);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> files_below(const std::string& dir) {
  std::vector<std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
       ++it) {
    const bool hidden = it->path().filename().string().starts_with(".");
    if (hidden && it->is_directory()) it.disable_recursion_pending();
    if (!hidden && it->is_regular_file()) out.push_back(it->path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> expand_text_inputs(const std::vector<std::string>& args) {
  std::vector<std::string> out;
  for (const std::string& a : args) {
    if (a == "-") {
      out.push_back(a);
    } else if (fs::is_directory(a)) {
      const std::vector<std::string> files = files_below(a);
      ENGINE_CHECK(!files.empty(), "tokenize: directory '" + a + "' holds no files");
      out.insert(out.end(), files.begin(), files.end());
    } else if (fs::exists(a)) {
      out.push_back(a);
    } else if (a.find_first_of("*?[") != std::string::npos) {
      const std::vector<std::string> files = glob_files(a);
      ENGINE_CHECK(!files.empty(), "tokenize: pattern '" + a + "' matches no file");
      out.insert(out.end(), files.begin(), files.end());
    } else {
      ENGINE_FAIL("tokenize: cannot open input '" + a + "'");
    }
  }
  return out;
}

bool is_jsonl_input(const std::string& path, const TextInputOptions& options) {
  return options.jsonl || path.ends_with(".jsonl");
}

DocumentReader::DocumentReader(std::vector<std::string> paths, TextInputOptions options)
    : paths_(std::move(paths)), options_(std::move(options)) {
  for (const std::string& p : paths_) {
    if (p == "-") {
      total_bytes_ = 0;
      break;
    }
    total_bytes_ += fs::file_size(p);
  }
}

DocumentReader::~DocumentReader() = default;

std::string DocumentReader::checked(std::string text, const std::string& where) const {
  const size_t bad = find_invalid_utf8(text);
  if (bad == kUtf8Valid) return text;
  ENGINE_CHECK(options_.replace_invalid, "tokenize: " + where + ": invalid UTF-8 at byte offset " +
                                             std::to_string(bad) +
                                             " (--replace-invalid substitutes U+FFFD)");
  return replace_invalid_utf8(text);
}

// Opens the next JSON Lines input, or reads a whole plain-text one into the pending document.
bool DocumentReader::open_next_file() {
  if (next_path_ >= paths_.size()) return false;
  path_ = paths_[next_path_++];
  line_ = 0;
  if (path_ == "-") {
    in_ = &std::cin;
    file_.reset();
  } else {
    file_ = std::make_unique<std::ifstream>(path_, std::ios::binary);
    ENGINE_CHECK(file_->good(), "tokenize: cannot open input '" + path_ + "'");
    in_ = file_.get();
  }
  return true;
}

bool DocumentReader::next(RawDocument& doc) {
  for (;;) {
    if (in_ == nullptr && !open_next_file()) return false;
    const std::string name = path_ == "-" ? "<stdin>" : path_;
    if (!is_jsonl_input(path_, options_)) {
      std::ostringstream ss;
      ss << in_->rdbuf();
      std::string raw = ss.str();
      bytes_read_ += raw.size();
      doc.bytes = checked(std::move(raw), name);
      doc.jsonl_file = -1;
      in_ = nullptr;
      return true;
    }
    while (std::getline(*in_, doc.bytes)) {
      ++line_;
      bytes_read_ += doc.bytes.size() + 1;
      if (doc.bytes.find_first_not_of(" \t\r") == std::string::npos) continue;  // blank line
      doc.jsonl_file = static_cast<int>(next_path_ - 1);
      doc.line = line_;
      return true;
    }
    ENGINE_CHECK(in_->eof(), "tokenize: reading '" + name + "' failed");
    in_ = nullptr;
  }
}

std::string DocumentReader::text(RawDocument&& doc) const {
  if (doc.jsonl_file < 0) return std::move(doc.bytes);
  const std::string& path = paths_[static_cast<size_t>(doc.jsonl_file)];
  const std::string where = (path == "-" ? "<stdin>" : path) + ":" + std::to_string(doc.line);
  const core::JsonValue v = core::parse_json(doc.bytes, "tokenize: " + where);
  const core::JsonValue* s = v.is_object() ? v.find(options_.jsonl_key) : nullptr;
  ENGINE_CHECK(s != nullptr && s->is_string(),
               "tokenize: " + where + ": expected a JSON object with a string \"" +
                   options_.jsonl_key + "\" (--jsonl-key names another key), got " +
                   (s != nullptr ? s->describe() : v.describe()));
  return s->text();  // the strict parser only yields valid UTF-8
}

}  // namespace data
