// core/output_file.h, the one way the tools write their files: a link, FIFO, device or folder at
// the target is refused by name and left as it was; a temporary name cannot be planted in
// advance; a failed write leaves the target as it was and no temporary file; a file that other
// hard links share is written as a copy of its own (or refused, for a lock).
#include "core/output_file.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <string>

#include "tests/test_util.h"

namespace fs = std::filesystem;
using test_util::error_of;

namespace {

fs::path fresh_dir(const std::string& name) {
  return test_util::fresh_dir("output_file_" + name);
}

using test_util::text_of;

std::set<std::string> names_in(const fs::path& dir) {
  std::set<std::string> out;
  for (const fs::directory_entry& e : fs::directory_iterator(dir))
    out.insert(e.path().filename().string());
  return out;
}

TEST(OutputFile, LinksFifosDevicesAndFoldersAreRefusedByNameAndLeftAlone) {
  const fs::path dir = fresh_dir("kinds");
  const fs::path outside = dir / "outside.txt";
  std::ofstream(outside) << "precious\n";
  const fs::path link = dir / "link.bin", fifo = dir / "fifo.bin", folder = dir / "folder.bin";
  fs::create_symlink(outside, link);
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  fs::create_directory(folder);
  const std::set<std::string> before = names_in(dir);
  const auto refusal = [](const fs::path& target) {
    return error_of([&] { core::write_output_file(target.string(), "data", "the weights"); });
  };
  EXPECT_NE(refusal(link).find("the weights " + link.string() + " is a symbolic link (to " +
                               outside.string() + ")"),
            std::string::npos)
      << refusal(link);
  EXPECT_NE(
      refusal(fifo).find("the weights " + fifo.string() + " is not a regular file (it is a FIFO)"),
      std::string::npos);
  EXPECT_NE(refusal(folder).find("the weights " + folder.string() +
                                 " is not a regular file (it is a directory)"),
            std::string::npos);
  // `engine export --out /dev/null` as root replaced /dev/null with a regular file. Refused
  // before anything is created beside it.
  EXPECT_NE(refusal("/dev/null")
                .find("the weights /dev/null is not a regular file (it is a "
                      "character device)"),
            std::string::npos)
      << refusal("/dev/null");
  struct stat st {};
  ASSERT_EQ(::lstat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  // The check before a run starts says the same, and lets a device through where writes go to it.
  EXPECT_NE(error_of([&] {
              core::check_output_file(fifo.string(), "the log file");
            }).find("(it is a FIFO)"),
            std::string::npos);
  EXPECT_EQ(error_of([&] {
              core::check_output_file("/dev/null", "the log file", core::DeviceTarget::Allowed);
            }),
            "(no error)");
  EXPECT_EQ(text_of(outside), "precious\n");
  EXPECT_TRUE(fs::is_symlink(link) && fs::is_fifo(fifo) && fs::is_directory(folder));
  EXPECT_EQ(names_in(dir), before);  // no temporary file left
  fs::remove_all(dir);
}

// A link planted at the target while the file is written (after the first check) is refused at
// the rename, and the temporary file goes.
TEST(OutputFile, ATargetThatBecomesALinkBeforeTheRenameIsRefused) {
  const fs::path dir = fresh_dir("swap");
  const fs::path outside = dir / "outside.txt", target = dir / "list.json";
  std::ofstream(outside) << "precious\n";
  {
    core::AtomicFile file(target.string(), "the file list");
    file.write("new", 3);
    fs::create_symlink(outside, target);
    EXPECT_NE(error_of([&] { file.commit(); }).find("is a symbolic link"), std::string::npos);
  }
  EXPECT_EQ(text_of(outside), "precious\n");
  EXPECT_TRUE(fs::is_symlink(target));
  EXPECT_EQ(names_in(dir), (std::set<std::string>{"outside.txt", "list.json"}));
  fs::remove_all(dir);
}

// The temporary name was PATH.tmp.<pid>, opened following links: a link planted there made the
// writer overwrite the file it named, and the rename made the target that link. The name is now
// unpredictable and opened with O_EXCL | O_NOFOLLOW: a planted link is never written through.
TEST(OutputFile, TemporaryNamesAreNewFilesOfTheirOwn) {
  const fs::path dir = fresh_dir("tmp");
  const fs::path outside = dir / "outside.txt", target = dir / "shards.json";
  std::ofstream(outside) << "precious\n";
  fs::create_symlink(outside, target.string() + ".tmp." + std::to_string(::getpid()));
  core::AtomicFile a(target.string(), "the file list"), b(target.string(), "the file list");
  EXPECT_NE(a.temporary_path(), b.temporary_path());
  EXPECT_EQ(fs::path(a.temporary_path()).parent_path(), dir);
  a.write("list", 4);
  a.commit();
  EXPECT_EQ(text_of(outside), "precious\n");
  EXPECT_FALSE(fs::is_symlink(target));
  EXPECT_EQ(text_of(target), "list");
  fs::remove_all(dir);
}

// A failed write (a full disk; here the file-size limit) names the file and the reason and
// leaves the target as it was, with no temporary file beside it.
TEST(OutputFile, AFailedWriteLeavesTheTargetAsItWas) {
  const fs::path dir = fresh_dir("full");
  const fs::path target = dir / "trace.json";
  std::ofstream(target) << "old";
  const int status = test_util::run_with_file_size_limit(64, [&] {
    const std::string big(1000, 'x');
    const std::string m = error_of([&] { core::write_output_file(target.string(), big, "x"); });
    return m.find("cannot write x " + target.string() + ": File too large") != std::string::npos
               ? 0
               : 1;
  });
  EXPECT_EQ(status, 0);
  EXPECT_EQ(text_of(target), "old");
  EXPECT_EQ(names_in(dir), std::set<std::string>{"trace.json"});
  fs::remove_all(dir);
}

// A file written in place that another name shares (a `cp -al` snapshot) becomes a copy of its
// own first: appended to, truncated or rewritten, the other name keeps what it held. A lock is
// refused instead.
TEST(OutputFile, AHardLinkedFileIsWrittenAsACopyOfItsOwn) {
  const fs::path dir = fresh_dir("hard");
  const fs::path file = dir / "log.txt", snapshot = dir / "snapshot.txt";
  std::ofstream(file) << "line 1\n";
  ::chmod(file.c_str(), 0640);
  fs::create_hard_link(file, snapshot);
  int fd = core::open_output_file(file.string(), O_WRONLY | O_CREAT | O_APPEND, "the log file");
  ASSERT_EQ(::write(fd, "line 2\n", 7), 7);
  ::close(fd);
  EXPECT_EQ(text_of(file), "line 1\nline 2\n");
  EXPECT_EQ(text_of(snapshot), "line 1\n");
  EXPECT_EQ(fs::hard_link_count(file), 1u);
  EXPECT_EQ(fs::status(file).permissions(), fs::status(snapshot).permissions());

  fs::remove(snapshot);
  fs::create_hard_link(file, snapshot);
  fd = core::open_output_file(file.string(), O_WRONLY | O_CREAT | O_TRUNC, "the log file");
  ASSERT_EQ(::write(fd, "new\n", 4), 4);
  ::close(fd);
  EXPECT_EQ(text_of(file), "new\n");
  EXPECT_EQ(text_of(snapshot), "line 1\nline 2\n");

  fs::remove(snapshot);
  fs::create_hard_link(file, snapshot);
  fd = core::open_output_file(file.string(), O_RDWR | O_CREAT, "the metrics file");
  char buf[8] = {};
  ASSERT_EQ(::read(fd, buf, 4), 4);  // read from the start, as a resumed metrics file is
  EXPECT_EQ(std::string(buf, 4), "new\n");
  ::close(fd);

  fs::remove(snapshot);
  fs::create_hard_link(file, snapshot);
  const std::string msg = error_of([&] {
    core::open_output_file(snapshot.string(), O_RDWR | O_CREAT, "the run lock",
                           core::SharedFile::Refuse);
  });
  EXPECT_NE(msg.find("the run lock " + snapshot.string() +
                     " is not a plain file of its own (it has 2 hard links)"),
            std::string::npos)
      << msg;
  fs::remove_all(dir);
}

}  // namespace
