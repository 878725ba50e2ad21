#!/usr/bin/env bash
# speedrun.sh CONFIG [--seeds N] [--np N] [--threads T] [--name NAME] [--target LOSS]
#             [--set key=value ...]
# Record attempts: N seeds of CONFIG under mpirun, logs kept in records/<date>_<name>/, and a
# summary of time to target and final val loss with a one-sided t-test (scripts/speedrun.py).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "${BASH_SOURCE[0]}")/speedrun.py" "$@"
