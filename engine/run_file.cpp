#include "engine/run_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/check.h"

namespace engine {

namespace {

[[noreturn]] void refuse_link(const std::string& path, const std::string& what) {
  std::error_code ec;
  const std::string target = std::filesystem::read_symlink(path, ec).string();
  ENGINE_FAIL(what + " " + path + " is a symbolic link" +
              (ec ? std::string() : " (to " + target + ")") +
              ": a run writes only files of its own in its folders, never through a link; remove "
              "the link or choose another folder");
}

[[noreturn]] void refuse_kind(const std::string& path, const std::string& what, mode_t mode) {
  const char* kind = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "not a file";
  ENGINE_FAIL(what + " " + path + " is not a regular file (it is " + kind +
              "); remove it or choose another folder");
}

// A regular file, or a character device (/dev/null; /dev/full is how the tests fill a disk): a
// FIFO would block the run, and a folder, socket or block device is no log.
bool writable_kind(mode_t mode) {
  return S_ISREG(mode) || S_ISCHR(mode);
}

}  // namespace

int open_run_file(const std::string& path, int flags, const std::string& what) {
  // O_NONBLOCK: a FIFO in the way is opened (or refused) at once instead of waiting for a reader.
  const int fd = ::open(path.c_str(), flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) refuse_link(path, what);
    if (err == ENXIO && ::lstat(path.c_str(), &st) == 0) refuse_kind(path, what, st.st_mode);
    ENGINE_FAIL("cannot open " + what + " " + path + ": " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !writable_kind(st.st_mode)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    refuse_kind(path, what, mode);
  }
  // Writes block as usual from here on (O_NONBLOCK does nothing for a regular file anyway).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

void write_run_file(const std::string& path, const std::string& text, const std::string& what) {
  const int fd = open_run_file(path, O_WRONLY | O_CREAT | O_TRUNC, what);
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "no progress";
      ::close(fd);
      ENGINE_FAIL("cannot write " + what + " " + path + ": " + why);
    }
    done += static_cast<size_t>(n);
  }
  ENGINE_CHECK(::close(fd) == 0, "cannot write " + what + " " + path + ": " + std::strerror(errno));
}

void check_run_file(const std::string& path, const std::string& what) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // not there yet: the run creates it
  if (S_ISLNK(st.st_mode)) refuse_link(path, what);
  if (!writable_kind(st.st_mode)) refuse_kind(path, what, st.st_mode);
}

}  // namespace engine
