#include "core/output_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/check.h"

namespace core {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void refuse_link(const std::string& path, const std::string& what) {
  std::error_code ec;
  const std::string target = fs::read_symlink(path, ec).string();
  ENGINE_FAIL(what + " " + path + " is a symbolic link" +
              (ec ? std::string() : " (to " + target + ")") +
              ": files are written only as files of their own, never through a link; remove the "
              "link or choose another path");
}

[[noreturn]] void refuse_kind(const std::string& path, const std::string& what, mode_t mode) {
  const char* kind = S_ISDIR(mode)    ? "a directory"
                     : S_ISFIFO(mode) ? "a FIFO"
                     : S_ISCHR(mode)  ? "a character device"
                     : S_ISBLK(mode)  ? "a block device"
                     : S_ISSOCK(mode) ? "a socket"
                                      : "not a file";
  ENGINE_FAIL(what + " " + path + " is not a regular file (it is " + kind +
              "); it is never written over: remove it or choose another path");
}

bool allowed_kind(mode_t mode, DeviceTarget devices) {
  return S_ISREG(mode) || (devices == DeviceTarget::Allowed && S_ISCHR(mode));
}

// Creates a new file beside `path` under a name nobody can plant anything at in advance: a dot,
// the file's name (at most 200 bytes of it, so the name stays under NAME_MAX) and 16 random hex
// digits, opened O_CREAT | O_EXCL | O_NOFOLLOW (an existing name, link or not, is never opened).
// Mode 0644 less the umask. Returns the descriptor and sets `tmp`.
int create_temporary(const std::string& path, const std::string& what, std::string& tmp) {
  const fs::path p(path);
  const std::string name = p.filename().string().substr(0, 200);
  std::random_device random;
  for (int attempt = 0; attempt < 64; ++attempt) {
    char suffix[17];
    std::snprintf(suffix, sizeof(suffix), "%08x%08x", random(), random());
    tmp = (p.parent_path() / ("." + name + "." + suffix)).string();
    const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    if (errno != EEXIST)
      ENGINE_FAIL("cannot write " + what + " " + path + ": cannot create a file in " +
                  (p.parent_path().empty() ? std::string(".") : p.parent_path().string()) + " (" +
                  std::strerror(errno) + ")");
  }
  ENGINE_FAIL("cannot write " + what + " " + path + ": no free temporary name beside it");
}

bool write_all(int fd, const char* data, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = ::write(fd, data, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) {
      errno = EIO;
      return false;
    }
    data += n;
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

// Replaces the shared regular file `path` (open as `fd`, `st` its stat) by a new file of its own
// holding the same bytes (none when `keep` is false) and mode; returns the new file's descriptor
// (read-write, at offset 0) and closes `fd`. The other names keep the old file untouched.
int own_copy(const std::string& path, int fd, const struct stat& st, bool keep,
             const std::string& what) {
  std::string tmp;
  const int copy = create_temporary(path, what, tmp);
  std::string why;
  if (keep) {
    // The content is read through a second open of the name, checked to be the same file.
    const int in = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    struct stat in_st {};
    if (in < 0 || ::fstat(in, &in_st) != 0 || in_st.st_ino != st.st_ino ||
        in_st.st_dev != st.st_dev)
      why = in < 0 ? std::strerror(errno) : "it changed while being opened";
    char buf[1 << 16];
    while (why.empty()) {
      const ssize_t n = ::read(in, buf, sizeof(buf));
      if (n < 0 && errno == EINTR) continue;
      if (n == 0) break;
      if (n < 0 || !write_all(copy, buf, static_cast<size_t>(n))) why = std::strerror(errno);
    }
    if (in >= 0) ::close(in);
  }
  if (why.empty() && (::fchmod(copy, st.st_mode & 07777) != 0 || ::lseek(copy, 0, SEEK_SET) != 0 ||
                      std::rename(tmp.c_str(), path.c_str())))
    why = std::strerror(errno);
  if (!why.empty()) {
    ::close(copy);
    ::unlink(tmp.c_str());
    ::close(fd);
    ENGINE_FAIL("cannot give " + what + " " + path + " a file of its own (it has " +
                std::to_string(st.st_nlink) + " hard links): " + why);
  }
  ::close(fd);
  return copy;
}

}  // namespace

void check_output_file(const std::string& path, const std::string& what, DeviceTarget devices) {
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) return;  // not there yet: the writer creates it
  if (S_ISLNK(st.st_mode)) refuse_link(path, what);
  if (!allowed_kind(st.st_mode, devices)) refuse_kind(path, what, st.st_mode);
}

int open_output_file(const std::string& path, int flags, const std::string& what,
                     SharedFile shared) {
  // O_NONBLOCK: a FIFO in the way is opened (or refused) at once instead of waiting for a reader.
  // O_TRUNC later: a file other names share is not to be emptied.
  int fd = ::open(path.c_str(), (flags & ~O_TRUNC) | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0644);
  if (fd < 0) {
    const int err = errno;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISLNK(st.st_mode)) refuse_link(path, what);
    if (err == ENXIO && ::lstat(path.c_str(), &st) == 0) refuse_kind(path, what, st.st_mode);
    ENGINE_FAIL("cannot open " + what + " " + path + ": " + std::strerror(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !allowed_kind(st.st_mode, DeviceTarget::Allowed)) {
    const mode_t mode = st.st_mode;
    ::close(fd);
    refuse_kind(path, what, mode);
  }
  const bool truncate = (flags & O_TRUNC) != 0 && S_ISREG(st.st_mode);
  if (S_ISREG(st.st_mode) && st.st_nlink > 1) {
    if (shared == SharedFile::Refuse) {
      ::close(fd);
      ENGINE_FAIL(what + " " + path + " is not a plain file of its own (it has " +
                  std::to_string(st.st_nlink) + " hard links); remove it");
    }
    fd = own_copy(path, fd, st, !truncate, what);
    if ((flags & O_APPEND) && ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_APPEND) != 0) {
      const int err = errno;
      ::close(fd);
      ENGINE_FAIL("cannot open " + what + " " + path + ": " + std::strerror(err));
    }
    return fd;
  }
  if (truncate && ::ftruncate(fd, 0) != 0) {
    const int err = errno;
    ::close(fd);
    ENGINE_FAIL("cannot open " + what + " " + path + ": " + std::strerror(err));
  }
  // Writes block as usual from here on (O_NONBLOCK does nothing for a regular file anyway).
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  return fd;
}

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  check_output_file(path_, what_);  // before any bytes are written
  fd_ = create_temporary(path_, what_, tmp_);
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

void AtomicFile::fail(const std::string& why) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  tmp_.clear();
  ENGINE_FAIL("cannot write " + what_ + " " + path_ + ": " + why);
}

void AtomicFile::write(const void* data, size_t bytes) {
  ENGINE_CHECK(fd_ >= 0, "cannot write " + what_ + " " + path_ + ": already committed");
  if (!write_all(fd_, static_cast<const char*>(data), bytes)) fail(std::strerror(errno));
}

void AtomicFile::sync() {
  ENGINE_CHECK(fd_ >= 0, "cannot write " + what_ + " " + path_ + ": already committed");
  if (::fsync(fd_) != 0) fail(std::strerror(errno));
}

void AtomicFile::commit() {
  sync();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) fail(std::strerror(errno));
  // What is at the target now (it may have changed since the constructor's check): only
  // nothing or a regular file is replaced.
  try {
    check_output_file(path_, what_);
  } catch (...) {
    ::unlink(tmp_.c_str());
    tmp_.clear();
    throw;
  }
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) fail(std::strerror(errno));
  tmp_.clear();
}

void write_output_file(const std::string& path, std::string_view text, const std::string& what) {
  AtomicFile file(path, what);
  file.write(text.data(), text.size());
  file.commit();
}

}  // namespace core
