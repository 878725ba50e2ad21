#!/usr/bin/env bash
# scripts/bundle.sh makes a folder that runs without the project's packages: the bundle is built
# from BUILD_DIR, then used from another folder with an empty environment (env -i plus its
# env.sh): `engine --help`, and 3 training steps of the tiny config at np 2 through the
# bundle's own mpirun. Where a private mount namespace can be made (root, unshare), every
# system copy of a library the bundle carries, and the system's Open MPI and PMIx folders, are
# hidden first, so the run proves it reads none of them.
#
#   bundle_test.sh REPO BUILD_DIR WORK
set -euo pipefail
repo=$1 build=$2 work=$3
rm -rf "$work" && mkdir -p "$work/run"
bash "$repo/scripts/bundle.sh" "$work/bundle" --build "$build" --no-cuda-libs
python3 "$repo/tests/e2e/make_tiny_data.py" "$work/run/data/tiny" >/dev/null
cp "$repo/configs/tiny.yaml" "$work/run/"

run_bundle() {
  cd "$work/run"
  # The sanitizer build's options cross the empty environment: without detect_leaks=0 its leak
  # check reports Open MPI's own allocations that outlive MPI_Finalize.
  env -i HOME="$HOME" OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1 \
    ${ASAN_OPTIONS:+ASAN_OPTIONS="$ASAN_OPTIONS"} ${UBSAN_OPTIONS:+UBSAN_OPTIONS="$UBSAN_OPTIONS"} \
    bash -c 'source ../bundle/env.sh
      engine --help | head -2
      mpirun --oversubscribe -np 2 engine --config tiny.yaml --set train.steps=3 \
        --set log.dir=runs/tiny --set checkpoint.dir=runs/tiny/checkpoints'
}

# Binds an empty folder over the system's Open MPI and PMIx and /dev/null over each system copy
# of a bundled library (inside the private namespace only). mount itself loads libpcre2 (through
# libselinux): that one is hidden last.
hide_system_copies() {
  mkdir -p "$work/empty"
  local targets=() last=() name dir
  for dir in /usr/lib/x86_64-linux-gnu/openmpi /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi; do
    [ -d "$dir" ] && mount --bind "$work/empty" "$dir"
  done
  for lib in "$work/bundle/lib/"*; do
    name=$(basename "$lib")
    for dir in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu/openblas-openmp; do
      [ -e "$dir/$name" ] || continue
      case "$name" in libpcre2*) last+=("$(readlink -f "$dir/$name")") ;;
        *) targets+=("$(readlink -f "$dir/$name")") ;; esac
    done
  done
  for file in "${targets[@]}" "${last[@]}"; do
    mount --bind /dev/null "$file" || { echo "bundle_test: could not hide $file" >&2; return 1; }
  done
}

if [ "$(id -u)" = 0 ] && unshare -m true 2>/dev/null; then
  export -f run_bundle hide_system_copies
  export work
  log=$(unshare -m bash -c 'hide_system_copies && run_bundle' 2>&1) || { echo "$log"; exit 1; }
  echo "bundle_test: ran with the system's copies of the bundled libraries and Open MPI hidden"
else
  log=$(run_bundle 2>&1) || { echo "$log"; exit 1; }
  echo "bundle_test: no private mount namespace here: ran with the system's libraries visible"
fi
echo "$log" | tail -4
grep -q "^done: 3 steps" <<<"$log" || { echo "bundle_test: the tiny run did not finish" >&2; exit 1; }
echo "bundle_test: ok"
