#!/usr/bin/env bash
# Packs a build into one folder that runs on a machine without this project's packages (a
# compute node, or a GPU machine with no package registry): the executables at their paths in
# the build tree (so the folder also serves as BUILD_DIR, and as --bundle of scripts/gpu_run.sh),
# the shared libraries they load that are not part of the C library or the GPU driver (the
# engine's own, libengine_*.so, with the GPU kernels, among them), and a
# relocated Open MPI (mpirun, its plugins and help files, PMIx) with an env.sh that points at it.
#
#   scripts/bundle.sh OUT [--build DIR] [--tests REGEX] [--no-cuda-libs] [--archive]
#
#   --build DIR      the build to pack (default: build)
#   --tests REGEX    only the test executables whose path in the build matches REGEX (default:
#                    all; the apps always): scripts/gpu_run.sh needs tests/.*(cuda|device|nccl|gpu)
#   --no-cuda-libs   leave out the CUDA toolkit's libraries (cudart, cuBLAS, cuSOLVER, NCCL, ...):
#                    for nodes that have the toolkit; the bundle is then a few hundred MB smaller
#   --archive        also write OUT.tar.xz (one solid xz stream), for a transfer with a size
#                    limit; unpack with tar -xJf OUT.tar.xz -C DIR
#
# Use it on the other machine (any folder, any environment):
#   source OUT/env.sh
#   mpirun -np 2 engine --config configs/tiny.yaml
set -euo pipefail

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; }
out=""
build=build
cuda_libs=1
archive=0
tests_regex=""
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift 2 ;;
    --tests) tests_regex="$2"; shift 2 ;;
    --no-cuda-libs) cuda_libs=0; shift ;;
    --archive) archive=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) echo "bundle: unknown option '$1'" >&2; usage >&2; exit 2 ;;
    *) [ -z "$out" ] || { echo "bundle: one OUT folder, got '$out' and '$1'" >&2; exit 2; }
       out="$1"; shift ;;
  esac
done
[ -n "$out" ] || { usage >&2; exit 2; }
[ -x "$build/apps/engine/engine" ] ||
  { echo "bundle: no engine in '$build' (build first: scripts/test.sh, or cmake --build $build)" >&2; exit 2; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
build=$(cd "$build" && pwd)

# ---- the executables: every app, and the test binaries -------------------------------------------
# Test work folders (tests/*/work_*: an earlier bundle among them) are not part of the build.
executables=()
while IFS= read -r f; do
  [[ "$f" == tests/* && -n "$tests_regex" && ! "$f" =~ $tests_regex ]] && continue
  executables+=("$f")
done < <(
  cd "$build" && find apps tests -path '*/work_*' -prune -o -type f -perm -u+x ! -name '*.so*' \
    ! -path '*/CMakeFiles/*' -exec sh -c 'head -c 4 "$1" | grep -q ELF' _ {} \; -print | sort)
for rel in "${executables[@]}"; do
  mkdir -p "$out/$(dirname "$rel")"
  cp "$build/$rel" "$out/$rel"
done

# ---- Open MPI, relocated with OPAL_PREFIX ------------------------------------------------------
# Open MPI finds its plugins, help files and helper programs from its prefix; Debian's prefix
# is /usr with libdir /usr/lib/<triplet>/openmpi/lib, so the bundle mirrors those paths under
# openmpi/ and OPAL_PREFIX points there. PMIx (an external package) relocates likewise through
# PMIX_INSTALL_PREFIX.
mpi_libdir=$(ompi_info --path libdir --parsable | sed 's/^path:libdir://')
mpi_pkglibdir=$(ompi_info --path pkglibdir --parsable | sed 's/^path:pkglibdir://')
mpi_pkgdatadir=$(ompi_info --path pkgdatadir --parsable | sed 's/^path:pkgdatadir://')
mpi_bindir=$(ompi_info --path bindir --parsable | sed 's/^path:bindir://')
mpi_prefix=$(ompi_info --path prefix --parsable | sed 's/^path:prefix://')
ompi="$out/openmpi"
mkdir -p "$ompi/bin" "$ompi${mpi_libdir#"$mpi_prefix"}" "$ompi${mpi_pkgdatadir#"$mpi_prefix"}"
for prog in mpirun mpiexec orterun orted ompi_info; do
  [ -e "$mpi_bindir/$prog" ] && cp -L "$mpi_bindir/$prog" "$ompi/bin/$prog"
done
cp -rL "$mpi_libdir/." "$ompi${mpi_libdir#"$mpi_prefix"}/"
cp -rL "$mpi_pkgdatadir/." "$ompi${mpi_pkgdatadir#"$mpi_prefix"}/"
pmix_prefix=""
pmix_with=$(ompi_info --parsable --all 2>/dev/null | grep -o "with-pmix=[^']*" | head -1 || true)
if [ -n "$pmix_with" ] && [ -d "${pmix_with#with-pmix=}" ]; then
  pmix_prefix="${pmix_with#with-pmix=}"
  mkdir -p "$out/pmix"
  cp -rL "$pmix_prefix/lib" "$out/pmix/"
  [ -d "$pmix_prefix/share" ] && cp -rL "$pmix_prefix/share" "$out/pmix/"
  rm -f "$out/pmix/lib/"*.a
fi
rm -rf "$ompi${mpi_libdir#"$mpi_prefix"}/pkgconfig"

# ---- every shared library those load, but the C library's and the driver's --------------------
# The C library (glibc: libc, libm, libpthread, libdl, librt, the loader) comes with every Linux
# system, and the GPU driver (libcuda, libnvidia-*) must match the kernel module, so both stay.
system_lib='^(linux-vdso|ld-linux|libc|libm|libpthread|libdl|librt|libutil|libresolv)\.so'
driver_lib='^(libcuda|libnvidia-|libnvcuvid|libnvoptix)'
cuda_lib='^(libcudart|libcublas|libcublasLt|libcusolver|libcusparse|libcufft|libcurand|libnvJitLink|libnvrtc|libnccl)\.so'
mkdir -p "$out/lib"
objects=("${executables[@]/#/$out/}")
while IFS= read -r so; do objects+=("$so"); done < <(find "$ompi" "$out/pmix" -name '*.so*' -type f 2>/dev/null)
declare -A copied=()
for obj in "${objects[@]}"; do
  while read -r name path; do
    [ -n "$path" ] && [ -f "$path" ] || continue
    if [[ "$name" =~ $system_lib || "$name" =~ $driver_lib ]]; then continue; fi
    if [ "$cuda_libs" = 0 ] && [[ "$name" =~ $cuda_lib ]]; then continue; fi
    [ -n "${copied[$name]:-}" ] && continue
    cp -L "$path" "$out/lib/$name"
    copied[$name]=1
  done < <(ldd "$obj" 2>/dev/null | awk '$2 == "=>" {print $1, $3}')
done

# The source folder the build was configured from: test executables read their fixtures from
# paths under it, compiled in (scripts/gpu_run.sh links it to the checkout where it is missing).
sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$build/CMakeCache.txt" >"$out/build_source_dir"

# ---- env.sh ------------------------------------------------------------------------------------
# LD_LIBRARY_PATH finds lib/ (the engine's libraries too) before the build tree's RUNPATH.
app_dirs=$(cd "$out" && find apps -mindepth 1 -maxdepth 1 -type d | sort | sed "s|^|\$here/|" | paste -sd:)
cat > "$out/env.sh" <<EOF
# Generated by scripts/bundle.sh: puts this bundle's programs, libraries and Open MPI first.
# Usage: source env.sh (from any folder).
here=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")" && pwd)
export PATH="\$here/openmpi/bin:$app_dirs:\${PATH:-/usr/bin:/bin}"
export LD_LIBRARY_PATH="\$here/lib:\$here/openmpi${mpi_libdir#"$mpi_prefix"}\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export OPAL_PREFIX="\$here/openmpi"
EOF
if [ -n "$pmix_prefix" ]; then
  cat >> "$out/env.sh" <<EOF
export PMIX_INSTALL_PREFIX="\$here/pmix"
export LD_LIBRARY_PATH="\$LD_LIBRARY_PATH:\$here/pmix/lib"
EOF
fi
cat >> "$out/env.sh" <<'EOF'
# Plugins whose own libraries (InfiniBand, UCX, ...) this node lacks are skipped, silently.
export OMPI_MCA_mca_base_component_show_load_errors=0
EOF

size=$(du -sh "$out" | cut -f1)
echo "bundle: $out ($size): ${#executables[@]} executables, ${#copied[@]} libraries$([ "$cuda_libs" = 0 ] && echo ', without the CUDA toolkit libraries'), $(ompi_info --version | head -1)"
echo "bundle: on the other machine: source $out/env.sh; mpirun -np 2 engine --config configs/tiny.yaml"
if [ "$archive" = 1 ]; then
  tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -9 >"$out.tar.xz"
  echo "bundle: $out.tar.xz ($(du -sh "$out.tar.xz" | cut -f1))"
fi
