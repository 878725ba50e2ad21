// tokenize: GPT-2 BPE from the command line. Text, JSON Lines, directories, globs or stdin ->
// train/validation token shards on all cores, or stdin text <-> ids.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <exception>
#include <fstream>
#include <iostream>
#include <limits>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/check.h"
#include "core/clock.h"
#include "core/json.h"
#include "data/gpt2_tokenizer.h"
#include "data/shard_outputs.h"
#include "data/shard_writer.h"
#include "data/text_documents.h"
#include "data/utf8.h"

namespace {

void print_usage() {
  std::printf(
      "usage:\n"
      "  tokenize [options] --output PREFIX INPUT... [--files-from LIST]\n"
      "      INPUT: a text file (one document), a .jsonl file (one document per line, the string\n"
      "      under --jsonl-key), a directory (every file below it, sorted), a glob pattern, or -\n"
      "      (stdin). Writes the token stream <|endoftext|> doc1 <|endoftext|> doc2 ... (the\n"
      "      separator before each document, as llm.c and modded-nanogpt do) into shards\n"
      "      PREFIX_000000.bin, PREFIX_000001.bin, ...; with a validation split into\n"
      "      PREFIX_train_000000.bin ... and PREFIX_val_000000.bin .... Prints documents,\n"
      "      tokens, shards, tokens/s and peak memory; progress on stderr while it runs.\n"
      "      The shards appear when the run succeeds, with PREFIX.tokenize.json listing them;\n"
      "      shards of PREFIX that exist already are refused (see --overwrite), and so is an\n"
      "      input that is one of them.\n"
      "  tokenize [options] --encode   UTF-8 text on stdin -> ids, space-separated on one line\n"
      "  tokenize [options] --decode   ids on stdin -> text on stdout\n"
      "\n"
      "options:\n"
      "  --vocab DIR            folder with encoder.json and vocab.bpe (default data/tokenizer)\n"
      "  --shard-tokens N       tokens per shard (default 100000000)\n"
      "  --files-from LIST      read more input paths from LIST, one per line\n"
      "  --jsonl                read every input (stdin too) as JSON Lines\n"
      "  --jsonl-key KEY        the key of a JSON Lines document's text (default text)\n"
      "  --val-docs N           the first N documents go to the validation shards\n"
      "  --val-fraction F       document i goes to validation when floor((i+1) F) > floor(i F),\n"
      "                         i.e. every (1/F)-th document (0 < F < 1)\n"
      "  --threads N            encoding threads (default and most: the cores); the output is\n"
      "                         the same for any N\n"
      "  --progress-seconds S   seconds between progress lines on stderr (default 5; 0 = none)\n"
      "  --replace-invalid      replace invalid UTF-8 with U+FFFD instead of failing\n"
      "  --overwrite            replace the shards of an earlier tokenize run of PREFIX (those\n"
      "                         its PREFIX.tokenize.json lists, unchanged); nothing else\n"
      "  --json                 print the summary as one JSON object\n"
      "  --help                 this text\n");
}

// `text` for a one-line message: control characters (a newline in a file name) as C escapes.
std::string printable(std::string_view text) {
  std::string out;
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (u >= 0x20 && u != 0x7f) {
      out += c;
      continue;
    }
    char buf[8];
    std::snprintf(buf, sizeof(buf), "\\x%02x", u);
    out += c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : buf;
  }
  return out;
}

std::string read_stream(std::istream& in) {
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The text, checked or repaired; `name` is what an error calls it.
std::string checked_text(std::string text, const std::string& name, bool replace_invalid) {
  const size_t bad = data::find_invalid_utf8(text);
  if (bad == data::kUtf8Valid) return text;
  ENGINE_CHECK(replace_invalid, "tokenize: " + name + ": invalid UTF-8 at byte offset " +
                                    std::to_string(bad) +
                                    " (--replace-invalid substitutes U+FFFD)");
  return data::replace_invalid_utf8(text);
}

// This process's peak resident memory in bytes (VmHWM: of this program alone, unlike
// getrusage's, which counts a parent's pages when it was started by fork and exec); 0 if unknown.
int64_t peak_memory_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;  // "N kB"
  return 0;
}

struct Options {
  std::string vocab = "data/tokenizer";
  std::string output;
  int64_t shard_tokens = 100000000;
  bool encode = false;
  bool decode = false;
  bool json = false;
  bool overwrite = false;
  data::TextInputOptions input;
  int64_t val_docs = 0;
  double val_fraction = 0;
  int threads = 0;  // 0: all cores
  double progress_seconds = 5;
  std::vector<std::string> inputs;
};

// Counters the progress reporter reads while the encoder runs.
struct Progress {
  std::atomic<int64_t> documents{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<uint64_t> bytes{0};
  uint64_t total_bytes = 0;  // 0: unknown (stdin)
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
};

std::string duration_text(double seconds) {
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof(buf), "%" PRId64 "h%02" PRId64 "m", s / 3600, s / 60 % 60);
  else
    std::snprintf(buf, sizeof(buf), "%" PRId64 "m%02" PRId64 "s", s / 60, s % 60);
  return buf;
}

// Prints a progress line to stderr every `every` seconds until stopped.
class ProgressReporter {
 public:
  ProgressReporter(const Progress& p, double every) : p_(p), every_(every) {
    if (every_ > 0) thread_ = std::thread([this] { loop(); });
  }
  ~ProgressReporter() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (!wake_.wait_for(lock, std::chrono::duration<double>(every_), [this] { return done_; }))
      print();
  }
  void print() const {
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - p_.start).count();
    const int64_t tokens = p_.tokens.load();
    const uint64_t bytes = p_.bytes.load();
    std::string eta = p_.total_bytes > 0 ? "unknown" : "unknown (stdin)";
    if (p_.total_bytes > 0 && bytes > 0)
      eta = duration_text(elapsed *
                          static_cast<double>(p_.total_bytes - std::min(bytes, p_.total_bytes)) /
                          static_cast<double>(bytes));
    std::fprintf(stderr,
                 "tokenize: %" PRId64 " documents, %" PRId64
                 " tokens, %.0f tokens/s, %.1f%% of the input, elapsed %s, ETA %s\n",
                 p_.documents.load(), tokens, static_cast<double>(tokens) / elapsed,
                 p_.total_bytes > 0 ? 100.0 * static_cast<double>(bytes) / p_.total_bytes : 0.0,
                 duration_text(elapsed).c_str(), eta.c_str());
  }

  const Progress& p_;
  double every_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool done_ = false;
  std::thread thread_;
};

// SIGINT, SIGTERM and SIGHUP while shards are written: the staging folder is removed and
// tokenize exits with 128 + the signal's number, so a stopped run leaves the folder as it was (a
// killed run left its staging folder and shards behind). The signals are blocked in every thread
// (the constructor runs before any other thread starts, and threads inherit the mask); one
// thread waits for them, so the removal runs as ordinary code, not in a signal handler. A signal
// ignored when tokenize started (nohup) stays ignored.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&set_);
    for (const int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction now {};
      if (::sigaction(sig, nullptr, &now) == 0 && now.sa_handler != SIG_IGN) sigaddset(&set_, sig);
    }
    ::pthread_sigmask(SIG_BLOCK, &set_, &old_);
    thread_ = std::thread([this] { wait(); });
  }
  ~StopSignals() {
    done_ = true;
    thread_.join();
    ::pthread_sigmask(SIG_SETMASK, &old_, nullptr);  // a signal pending now ends the process
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The outputs to abandon on a signal (nullptr: none).
  void watch(data::ShardOutputs* outputs) {
    std::lock_guard<std::mutex> lock(mutex_);
    outputs_ = outputs;
  }

 private:
  void wait() {
    const timespec poll{0, 100 * 1000 * 1000};
    while (!done_) {
      const int sig = ::sigtimedwait(&set_, nullptr, &poll);
      if (sig <= 0) continue;
      std::lock_guard<std::mutex> lock(mutex_);
      if (outputs_ != nullptr) outputs_->abandon();
      const char* name = sigabbrev_np(sig);
      std::fprintf(stderr,
                   "tokenize: stopped by SIG%s; no shard written (staging folder removed)\n",
                   name != nullptr ? name : "NAL");
      std::fflush(stderr);
      std::_Exit(128 + sig);  // the kernel drops the prefix's lock
    }
  }

  sigset_t set_{}, old_{};
  std::atomic<bool> done_{false};
  std::mutex mutex_;
  data::ShardOutputs* outputs_ = nullptr;
  std::thread thread_;
};

// Whether document `index` (0-based, input order) belongs to the validation split.
bool is_val_document(int64_t index, const Options& opt) {
  if (opt.val_docs > 0) return index < opt.val_docs;
  if (opt.val_fraction > 0)
    return std::floor(static_cast<double>(index + 1) * opt.val_fraction) >
           std::floor(static_cast<double>(index) * opt.val_fraction);
  return false;
}

int run_shards(const Options& opt, StopSignals& signals) {
  const std::vector<std::string> paths = data::expand_text_inputs(opt.inputs);
  ENGINE_CHECK(!paths.empty(), "tokenize: no input files");
  // Refused before any work: what exists under the prefix, an input that is an output, another
  // run of the prefix.
  std::unique_ptr<data::ShardOutputs> outputs;
  try {
    outputs = std::make_unique<data::ShardOutputs>(opt.output, paths, opt.overwrite);
  } catch (const core::Error& e) {
    std::fprintf(stderr, "%s\n", printable(e.what()).c_str());
    return 2;
  }
  for (const std::string& stale : outputs->removed_stale())
    std::fprintf(stderr, "tokenize: removed %s, left by a killed tokenize run of this prefix\n",
                 printable(stale).c_str());
  signals.watch(outputs.get());
  struct Unwatch {
    StopSignals& s;
    ~Unwatch() { s.watch(nullptr); }  // before the outputs go
  } unwatch{signals};
  // Threads beyond the cores only wait for them, and each one holds a workspace (a few MB once
  // its cache fills): --threads 1000 took 9.9 GB with a tokenizer per thread.
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const int threads = std::min(opt.threads > 0 ? opt.threads : cores, cores);
  if (opt.threads > cores)
    std::fprintf(stderr, "tokenize: --threads %d is more than the %d core(s) here; using %d\n",
                 opt.threads, cores, threads);
  // One tokenizer, read-only, shared by the threads; each thread encodes with a workspace of its
  // own (the piece cache and the merge scratch), made when the thread first has a document, so a
  // small input (fewer documents per batch than threads) makes only as many as it uses.
  const data::Gpt2Tokenizer tokenizer(opt.vocab);
  std::vector<std::unique_ptr<data::Gpt2Tokenizer::Workspace>> workspaces(
      static_cast<size_t>(threads));
  const bool split = opt.val_docs > 0 || opt.val_fraction > 0;
  data::ShardWriter train(outputs->staged(split ? opt.output + "_train" : opt.output),
                          opt.shard_tokens);
  std::unique_ptr<data::ShardWriter> val;
  if (split)
    val =
        std::make_unique<data::ShardWriter>(outputs->staged(opt.output + "_val"), opt.shard_tokens);

  data::DocumentReader reader(paths, opt.input);
  Progress progress;
  progress.total_bytes = reader.total_bytes();
  std::atomic<double> encode_cpu_seconds{0};
  int64_t documents = 0, val_documents = 0;
  {
    ProgressReporter reporter(progress, opt.progress_seconds);
    // Batches of documents: read in order, encoded by all threads, written in order, so the
    // output does not depend on the thread count.
    constexpr size_t kBatchBytes = 16u << 20;
    constexpr size_t kBatchDocs = 4096;
    std::vector<data::RawDocument> docs;
    std::vector<std::vector<int32_t>> ids;
    std::vector<std::exception_ptr> errors;
    for (bool more = true; more;) {
      size_t count = 0, batch_bytes = 0;
      while (count < kBatchDocs && batch_bytes < kBatchBytes) {
        if (docs.size() <= count) docs.emplace_back();
        if (!(more = reader.next(docs[count]))) break;
        batch_bytes += docs[count++].bytes.size();
      }
      ids.resize(count);
      errors.assign(count, nullptr);
      std::atomic<size_t> next{0};
      // Decoding a JSON line and encoding its text both run on the workers.
      const auto work = [&](int t) {
        const double cpu0 = core::thread_cpu_seconds();
        for (size_t i; (i = next.fetch_add(1)) < count;) {
          try {
            if (!workspaces[t])
              workspaces[t] = std::make_unique<data::Gpt2Tokenizer::Workspace>(tokenizer);
            const std::string text = reader.text(std::move(docs[i]));
            ids[i].assign(1, data::Gpt2Tokenizer::kEndOfText);
            tokenizer.encode(text, ids[i], *workspaces[t]);
          } catch (...) {
            errors[i] = std::current_exception();
          }
          progress.tokens += static_cast<int64_t>(ids[i].size());
          progress.documents += 1;
        }
        encode_cpu_seconds += core::thread_cpu_seconds() - cpu0;
      };
      std::vector<std::thread> pool;
      for (int t = 1; t < std::min<int>(threads, static_cast<int>(count)); ++t)
        pool.emplace_back(work, t);
      work(0);
      for (std::thread& th : pool)
        th.join();
      // The first failing document in input order, whatever the thread count.
      for (const std::exception_ptr& e : errors)
        if (e) std::rethrow_exception(e);
      for (size_t i = 0; i < count; ++i, ++documents) {
        const bool to_val = split && is_val_document(documents, opt);
        (to_val ? *val : train).append(ids[i]);
        val_documents += to_val;
      }
      progress.bytes = reader.bytes_read();
    }
  }
  if (train.tokens() + (val ? val->tokens() : 0) == documents) {
    // Every document is empty (or there is none: an empty JSON Lines file), so the shards would
    // hold separators alone; refused rather than "succeeding" with no shard or an empty one.
    std::fprintf(stderr,
                 "tokenize: no text in the input (%zu file(s), %" PRId64
                 " document(s), all empty): no shard is written\n",
                 paths.size(), documents);
    return 2;
  }
  if (split && (train.tokens() == 0 || val->tokens() == 0)) {
    // One side of the split would be empty: no shard file for it (the engine would find no
    // data there), and the other side's staged shards go with the staging folder.
    char option[64];
    if (opt.val_docs > 0)
      std::snprintf(option, sizeof(option), "--val-docs %" PRId64, opt.val_docs);
    else
      std::snprintf(option, sizeof(option), "--val-fraction %g", opt.val_fraction);
    std::fprintf(stderr,
                 "tokenize: %s puts %" PRId64 " of the %" PRId64
                 " documents into validation: the %s split would be empty, so no %s_%s shard "
                 "is written, nor any other; give %s\n",
                 option, val_documents, documents, train.tokens() == 0 ? "training" : "validation",
                 printable(opt.output).c_str(), train.tokens() == 0 ? "train" : "val",
                 train.tokens() == 0 ? "fewer validation documents" : "a larger validation share");
    return 2;
  }
  const int train_shards = train.finish();
  const int val_shards = val ? val->finish() : 0;
  outputs->commit();
  const int64_t tokens = train.tokens() + (val ? val->tokens() : 0);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - progress.start).count();
  const double rate = seconds > 0 ? static_cast<double>(tokens) / seconds : 0.0;
  const double cpu_rate =
      encode_cpu_seconds > 0 ? static_cast<double>(tokens) / encode_cpu_seconds : 0.0;
  const int64_t peak_bytes = peak_memory_bytes();
  if (opt.json) {
    std::printf("{\"output\":%s,\"documents\":%" PRId64 ",\"tokens\":%" PRId64
                ",\"shards\":%d,\"val_documents\":%" PRId64 ",\"val_tokens\":%" PRId64
                ",\"val_shards\":%d,\"threads\":%d,\"total_seconds\":%.3f,"
                "\"tokens_per_s\":%.0f,\"encode_cpu_seconds\":%.3f,\"tokens_per_cpu_s\":%.0f,"
                "\"peak_memory_bytes\":%" PRId64 "}\n",
                core::json_escape(opt.output).c_str(), documents, tokens, train_shards + val_shards,
                val_documents, val ? val->tokens() : 0, val_shards, threads, seconds, rate,
                encode_cpu_seconds.load(), cpu_rate, peak_bytes);
  } else {
    std::printf("%s: %" PRId64 " documents, %" PRId64 " tokens, %d shard(s)",
                printable(opt.output).c_str(), documents, tokens, train_shards + val_shards);
    if (split)
      std::printf(" (validation: %" PRId64 " documents, %" PRId64 " tokens, %d shard(s))",
                  val_documents, val->tokens(), val_shards);
    std::printf("; %.3f s, %.0f tokens/s on %d thread(s)\n", seconds, rate, threads);
    std::printf("encode CPU time %.3f s: %.0f tokens per CPU-second; peak memory %.1f MiB\n",
                encode_cpu_seconds.load(), cpu_rate, static_cast<double>(peak_bytes) / (1 << 20));
  }
  return 0;
}

int run_encode(const Options& opt) {
  data::Gpt2Tokenizer tokenizer(opt.vocab);
  const std::string text =
      checked_text(read_stream(std::cin), "<stdin>", opt.input.replace_invalid);
  const std::vector<int32_t> ids = tokenizer.encode(text);
  std::string line;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i > 0) line += ' ';
    line += std::to_string(ids[i]);
  }
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stdout);
  return 0;
}

int run_decode(const Options& opt) {
  data::Gpt2Tokenizer tokenizer(opt.vocab);
  std::vector<int32_t> ids;
  std::string word;
  int64_t index = 0;
  while (std::cin >> word) {
    char* end = nullptr;
    errno = 0;
    const long v = std::strtol(word.c_str(), &end, 10);
    ENGINE_CHECK(
        errno == 0 && end != word.c_str() && *end == '\0' && v >= 0 && v < tokenizer.vocab_size(),
        "tokenize --decode: item " + std::to_string(index) + " '" + word +
            "' is not a token id in [0, " + std::to_string(tokenizer.vocab_size()) + ")");
    ids.push_back(static_cast<int32_t>(v));
    ++index;
  }
  const std::string text = tokenizer.decode(ids);
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const auto value = [&]() -> std::string {
        ENGINE_CHECK(i + 1 < argc, "tokenize: " + a + " needs a value");
        return argv[++i];
      };
      const auto integer = [&](const std::string& v, int64_t min,
                               int64_t max = std::numeric_limits<int64_t>::max()) {
        char* end = nullptr;
        errno = 0;
        const long long x = std::strtoll(v.c_str(), &end, 10);
        ENGINE_CHECK(!v.empty() && *end == '\0' && errno == 0 && x >= min && x <= max,
                     "tokenize: " + a + " '" + v + "' is not an integer " +
                         (max == std::numeric_limits<int64_t>::max()
                              ? ">= " + std::to_string(min)
                              : "in [" + std::to_string(min) + ", " + std::to_string(max) + "]"));
        return static_cast<int64_t>(x);
      };
      if (a == "--help" || a == "-h") {
        print_usage();
        return 0;
      } else if (a == "--encode") {
        opt.encode = true;
      } else if (a == "--decode") {
        opt.decode = true;
      } else if (a == "--overwrite") {
        opt.overwrite = true;
      } else if (a == "--replace-invalid") {
        opt.input.replace_invalid = true;
      } else if (a == "--jsonl") {
        opt.input.jsonl = true;
      } else if (a == "--jsonl-key") {
        opt.input.jsonl_key = value();
      } else if (a == "--val-docs") {
        opt.val_docs = integer(value(), 1);
      } else if (a == "--threads") {
        opt.threads = static_cast<int>(integer(value(), 1, 1 << 20));
      } else if (a == "--val-fraction" || a == "--progress-seconds") {
        const std::string v = value();
        char* end = nullptr;
        const double x = std::strtod(v.c_str(), &end);
        const bool fraction = a == "--val-fraction";
        ENGINE_CHECK(
            !v.empty() && *end == '\0' && std::isfinite(x) && (fraction ? x > 0 && x < 1 : x >= 0),
            "tokenize: " + a + " '" + v + "' is not a number " +
                (fraction ? "between 0 and 1" : ">= 0"));
        (fraction ? opt.val_fraction : opt.progress_seconds) = x;
      } else if (a == "--json") {
        opt.json = true;
      } else if (a == "--vocab") {
        opt.vocab = value();
      } else if (a == "--output") {
        opt.output = value();
      } else if (a == "--shard-tokens") {
        // The header's count is an int32: past it ShardWriter failed later, without the
        // "tokenize:" prefix and with exit status 1.
        opt.shard_tokens = integer(value(), 1, std::numeric_limits<int32_t>::max());
      } else if (a == "--files-from") {
        const std::string list = value();
        std::ifstream in(list);
        ENGINE_CHECK(in.good(), "tokenize: cannot open file list '" + list + "'");
        for (std::string line; std::getline(in, line);) {
          if (!line.empty()) opt.inputs.push_back(line);
        }
      } else if (a.starts_with("--") || (a.starts_with("-") && a != "-")) {
        std::fprintf(stderr, "tokenize: unknown option %s\n", printable(a).c_str());
        print_usage();
        return 2;
      } else {
        opt.inputs.push_back(a);
      }
    }
    if (opt.encode + opt.decode + !opt.output.empty() != 1) {
      std::fprintf(stderr, "tokenize: give exactly one of --encode, --decode, --output PREFIX\n");
      print_usage();
      return 2;
    }
    if (opt.val_docs > 0 && opt.val_fraction > 0) {
      std::fprintf(stderr, "tokenize: give --val-docs or --val-fraction, not both\n");
      return 2;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", printable(e.what()).c_str());  // a usage error
    return 2;
  }
  try {
    if (opt.encode) return run_encode(opt);
    if (opt.decode) return run_decode(opt);
    StopSignals signals;
    return run_shards(opt, signals);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", printable(e.what()).c_str());
    return 1;
  }
}
