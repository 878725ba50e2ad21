// Helpers shared by the unit tests.
#pragma once

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/check.h"

namespace test_util {

// The message of the core::Error that `fn` throws, or "(no error)" when it returns normally.
template <typename Fn>
std::string error_of(Fn&& fn) {
  try {
    fn();
  } catch (const core::Error& e) {
    return e.what();
  }
  return "(no error)";
}

// How often `needle` occurs in `text`.
inline int count_of(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1))
    ++n;
  return n;
}

// An empty folder <tmp>/engine_<name>, made afresh (what an earlier run left there removed).
inline std::filesystem::path fresh_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / ("engine_" + name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A file's whole text ("" when it cannot be read).
inline std::string text_of(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Runs fn in a child process whose files may not grow beyond `bytes` (a write past it fails with
// EFBIG, as one on a full disk fails with ENOSPC); returns fn's result as the child's exit status
// (99 for an escaped exception, -1 when the child did not exit).
template <typename Fn>
int run_with_file_size_limit(rlim_t bytes, Fn&& fn) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);
    const rlimit limit{bytes, bytes};
    setrlimit(RLIMIT_FSIZE, &limit);
    int status = 99;
    try {
      status = fn();
    } catch (const std::exception&) {
    }
    _exit(status);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace test_util
