#!/usr/bin/env bash
# The wheels that a lent GPU host lacks for bench/device_check.py, downloaded into .whl/ (git-ignored)
# for that host's Python 3.12 on manylinux x86-64, then the size of everything that travels checked
# against the device tool's 64 MiB: the checkout's files that git does not ignore, plus .whl/.
# docs/development.md ("The accelerator check") gives the steps around it.
#
#   bash bench/device_wheels.sh
#
# The hosts carry JAX, flax, PyTorch, numpy, safetensors, pillow, httpx, huggingface-hub, anyio,
# h11 and click. What they lack: diffusers (the reference; pure Python) and importlib-metadata (its
# one missing need), and the service's FastAPI, starlette, uvicorn, pydantic (with its compiled core
# and settings), python-dotenv, annotated-types, typing-inspection, opentelemetry-api (FastAPI
# needs it), PyAV (MP4 answers; 35 MB of the kit, FFmpeg inside), and a typing-extensions new enough
# for that pydantic and annotated-doc (FastAPI's; the hosts list it too, but it weighs nothing). The service's versions are the ones locks/cpu.txt pins, so the host runs what
# the image runs.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=.whl
LIMIT_BYTES=$((64 * 1024 * 1024))
PYTHON=${PYTHON:-python3}
# The diffusers the tests and parity fixtures were made with.
PINNED=(diffusers==0.42.1 importlib-metadata==10.2.0)
FROM_LOCK=(fastapi starlette uvicorn pydantic pydantic-core pydantic-settings python-dotenv annotated-types
           annotated-doc typing-inspection opentelemetry-api av typing-extensions)

lock_pin() {  # name==version as locks/cpu.txt pins it for the hosts' Python 3.12
    local pin
    pin=$(grep -E "^$1==[^ ;\\]+( ; python_full_version >= '3\.12')?[ \\]*$" locks/cpu.txt | head -n 1 |
          sed -E 's/[ ;\\].*//')
    [ -n "$pin" ] || { echo "locks/cpu.txt pins no $1 for Python 3.12" >&2; exit 1; }
    echo "$pin"
}

wanted=("${PINNED[@]}")
for name in "${FROM_LOCK[@]}"; do
    wanted+=("$(lock_pin "$name")")
done

rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$DEST" "${wanted[@]}"

# One version of each (two stop the whole install there), and each one asked for.
count=$(find "$DEST" -type f -name '*.whl' | wc -l)
[ "$count" -eq "${#wanted[@]}" ] || { echo "expected ${#wanted[@]} wheels in $DEST, found $count" >&2; exit 1; }

# What travels: the files git does not ignore (tracked, and untracked ones), then the wheels.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null |
             awk '{s += $1} END {print s + 0}')
wheel_bytes=$(find "$DEST" -type f -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
total=$((tree_bytes + wheel_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
echo "wheels: $count in $DEST, $(mib "$wheel_bytes"); checkout: $(mib "$tree_bytes"); together $(mib "$total")" \
     "of the $(mib "$LIMIT_BYTES") that may travel"
if [ "$total" -gt "$LIMIT_BYTES" ]; then
    echo "over the limit by $(mib $((total - LIMIT_BYTES))): the device tool would refuse the call" >&2
    exit 1
fi
