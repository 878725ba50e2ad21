// Where `engine export --out` may write: refused by name when OUT is empty, a folder name for a
// file, a link, a FIFO, a device, a folder or a program; nothing at OUT is touched by a refusal.
#include "engine/export_target.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "tests/test_util.h"

namespace fs = std::filesystem;
using test_util::error_of;

namespace {

TEST(ExportTarget, NonRegularTargetsProgramsAndBadNamesAreRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / "engine_export_target";
  fs::remove_all(dir);
  fs::create_directories(dir / "ckpt");
  const std::string ckpt = (dir / "ckpt").string();
  const auto refusal = [&](const std::string& out, bool hf = false) {
    return error_of([&] { engine::check_export_target(out, ckpt, hf); });
  };
  const fs::path fifo = dir / "fifo", program = dir / "program", file = dir / "file";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0644), 0);
  std::ofstream(program) << "#!/bin/sh\n";
  fs::permissions(program, fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
  std::ofstream(file) << "weights";
  fs::create_symlink(file, dir / "link");
  const struct {
    std::string out;
    bool hf;
    std::string want;
  } cases[] = {
      {"", false, "engine export: --out is empty"},
      {"", true, "engine export: --out is empty"},
      // `--out /dev/null`, the natural check that a checkpoint reads whole, replaced the device.
      {"/dev/null", false,
       "engine export: --out /dev/null is not a regular file (it is a "
       "character device)"},
      {fifo.string(), false,
       "engine export: --out " + fifo.string() + " is not a regular file (it is a FIFO)"},
      {dir.string(), false, "is not a regular file (it is a directory)"},
      {(dir / "link").string(), false, "is a symbolic link (to " + file.string() + ")"},
      {program.string(), false,
       "engine export: --out " + program.string() + " is an executable file (mode 0750)"},
      {file.string() + "/", false,
       "engine export: --out '" + file.string() +
           "/' ends in '/': the engine format writes one "
           ".safetensors file"},
      {file.string() + "/", true,
       "engine export: --out " + file.string() +
           " is a file, not a folder: --format hf writes a folder"},
      {fifo.string(), true, "(it is a FIFO)"},
  };
  for (const auto& c : cases) {
    const std::string msg = refusal(c.out, c.hf);
    EXPECT_NE(msg.find(c.want), std::string::npos) << "'" << c.out << "': " << msg;
  }
  fs::create_directories(dir / "hf");
  fs::create_directories(dir / "hf" / "config.json");
  EXPECT_NE(refusal((dir / "hf").string(), true)
                .find("engine export: --out " + (dir / "hf").string() + ": " +
                      (dir / "hf" / "config.json").string() + " is not a regular file"),
            std::string::npos);
  // A regular file, a new name and a new or existing folder for hf are fine.
  EXPECT_EQ(refusal(file.string()), "(no error)");
  EXPECT_EQ(refusal((dir / "new.safetensors").string()), "(no error)");
  EXPECT_EQ(refusal((dir / "new_hf").string(), true), "(no error)");
  EXPECT_EQ(refusal((dir / "ckpt2").string() + "/", true), "(no error)");
  struct stat st {};
  ASSERT_EQ(::lstat("/dev/null", &st), 0);
  EXPECT_TRUE(S_ISCHR(st.st_mode));
  EXPECT_TRUE(fs::is_fifo(fifo));
  fs::remove_all(dir);
}

}  // namespace
