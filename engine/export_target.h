// Where `engine export` may write: never into the checkpoint it reads, nor into any other
// checkpoint folder (`--out S/rank_00000.safetensors` replaced a file of the checkpoint S being
// read: rc 0, and S no longer loaded); never over a link, a device, a FIFO or a program (`--out
// /dev/null` as root replaced the system's /dev/null with a regular file, and `--out` naming the
// engine's executable replaced it).
#pragma once

#include <string>

namespace engine {

// Throws core::Error naming --out and the checkpoint folder when `out` (a .safetensors file, or
// for --format hf, `hf_folder`, a folder) resolves to the checkpoint folder `checkpoint` or a
// path inside it, or inside any folder that holds a manifest.yaml (another checkpoint). Links and
// `..` are resolved first (std::filesystem::weakly_canonical: the part of the path that exists).
// Throws naming --out and what is there when `out` is empty, ends in '/' for a file, or is
// anything but nothing or a regular file without execute permission (for a folder: nothing or a
// folder, its config.json and model.safetensors nothing or regular files); the writer checks
// again as it writes (core/output_file.h).
void check_export_target(const std::string& out, const std::string& checkpoint, bool hf_folder);

}  // namespace engine
