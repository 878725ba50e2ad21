// Where `engine export` may write: never into the checkpoint it reads, nor into any other
// checkpoint folder. `--out S/rank_00000.safetensors` replaced a file of the checkpoint S being
// read (rc 0, and S no longer loaded).
#pragma once

#include <string>

namespace engine {

// Throws core::Error naming --out and the checkpoint folder when `out` (a .safetensors file, or
// for --format hf a folder) resolves to the checkpoint folder `checkpoint` or a path inside it,
// or inside any folder that holds a manifest.yaml (another checkpoint). Links and `..` are
// resolved first (std::filesystem::weakly_canonical: the part of the path that exists).
void check_export_target(const std::string& out, const std::string& checkpoint);

}  // namespace engine
