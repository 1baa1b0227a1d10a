"""The GPU measuring scripts keep running, on the CPU: ``scripts/gpu_profile.py``'s bare decode loops and
engine steps, ``scripts/round_trace.py`` on a workload (greedy, and sampled beside mlx-lm's sampler), ``scripts/draft_replay.py``,
``scripts/attention_shapes.py``, ``scripts/pass_widths.py`` and the trace step of ``scripts/gpu-bench.sh``."""

from __future__ import annotations

import doctest
import importlib.util
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
from pathlib import Path

import pytest

from engine.drafts.cost_model import CostModel

LINUX = hasattr(os, "sched_getaffinity")  # where round_trace.py records its CPUs and taskset pins them


def _load(name: str):  # -> the module scripts/<name>.py
    spec = importlib.util.spec_from_file_location(name, Path(__file__).parent.parent / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # a script's dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _script():  # -> scripts/gpu_profile.py
    return _load("gpu_profile")


def _gpu_bench(tmp_path: Path, **settings: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``scripts/gpu-bench.sh`` on the CPU with this checkout's packages, ``settings`` added to its
    environment; returns the finished run and its OUT folder."""
    env = {**os.environ, "SITE": sysconfig.get_paths()["purelib"], **settings,
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    out = tmp_path / "out"
    done = subprocess.run(["bash", "scripts/gpu-bench.sh", str(tmp_path / "no-wheels"), str(out)],
                          cwd=Path(__file__).parent.parent, env=env, capture_output=True, text=True, timeout=900)
    return done, out


@pytest.mark.parametrize("kind", ["mlx-lm", "lanes-even", "lanes-ragged"])
def test_bare_loop_times_every_part(loaded, kind: str) -> None:
    r = _script().bare_loop(loaded, kind, 2, 2)
    assert set(r) == {"build", "dispatch", "wall"}
    assert 0 < r["build"] < r["wall"] and r["dispatch"] > 0


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_attention_shapes_times_new_shapes_against_a_repeated_one(dtype: str) -> None:
    import mlx.core as mx

    r = _load("attention_shapes").measure(getattr(mx, dtype), 3, 2, 4)
    assert r["new_shapes"] == 3 and r["error"] is None
    assert all(isinstance(r[k], float) and r[k] > 0 for k in ("same_ms", "new_50_ms", "new_200_ms"))


def test_attention_shapes_reports_the_shape_that_raised(monkeypatch) -> None:
    """A new shape that raises (as MLX does on CUDA once its attention cache thrashes) ends the run
    and is reported with how many new shapes ran before it."""
    import mlx.core as mx

    script = _load("attention_shapes")
    real = script.attend

    def attend(keys: int, *args):
        if keys == script.FIRST_KEYS + 2:
            raise RuntimeError("Cache thrashing is happening")
        return real(keys, *args)

    monkeypatch.setattr(script, "attend", attend)
    r = script.measure(mx.bfloat16, 5, 1, 2)
    assert r["new_shapes"] == 2 and r["error"] == "Cache thrashing is happening"


def test_round_trace_sorts_a_workloads_rounds_by_kind(tmp_path: Path) -> None:
    """``scripts/round_trace.py`` on two streams of the copy-heavy workload, GPU round logic on the CPU:
    every round is sorted into a kind, and drafting rounds appear only where drafts are allowed; each
    round's parts (its own pass, the one run ahead after it, the wait for its choices) fit in it."""
    root = Path(__file__).parent.parent
    out = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, "scripts/round_trace.py", "--workload", "resources/workloads/copy-heavy.jsonl",
         "--streams", "2", "--repeats", "1", "--max-tokens", "24", "--cells", "plain,on", "--accelerator",
         "--json", str(out)], cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    for cell in ("plain", "on"):
        (run,) = runs[cell]
        kinds = ("ahead", "continued", "sync", "draft", "dropped", "waited", "joining")
        assert sum(run[k]["n"] for k in kinds) == run["rounds"] > 0
    assert runs["plain"][0]["drafting"]["rounds"] == 0
    assert runs["on"][0]["drafting"]["accepted"] > 0
    rounds = runs["on"][0]["trace"]
    for r in rounds:
        assert 0 <= r.get("build", 0) + r.get("next", 0) + r.get("wait", 0) <= r["seconds"]
    # Plain rounds run ahead: nothing of their own to build, the next one to queue.
    ahead = runs["plain"][0]["ahead"]
    assert ahead["n"] > 0 and ahead["next_ms_median"] > ahead["build_ms_median"] >= 0
    assert all("choices" not in r for r in rounds)  # only the parts are kept


def test_round_trace_prices_rounds_with_a_devices_costs_held_fixed(tmp_path: Path) -> None:
    """``round_trace.py --costs``: a device's trace JSON prices every round, and its rounds change
    nothing in it, so the CPU makes that device's choices (here costs of an H100's 8-stream trace,
    written as a literal); ``device_costs``' worked example runs too."""
    assert doctest.testmod(_load("round_trace")).failed == 0
    root = Path(__file__).parent.parent
    device = {"8x1": 16.45, "8x32": 20.25, "2x1": 18.31, "2x8": 21.42, "1x1": 8.59, "4x1": 16.95, "4x8": 19.19}
    (tmp_path / "h100.json").write_text(json.dumps({"runs": {"on": [{"observed_ms": device, "model_ms": {
        "kept8": 8.2, "pass8x1": 16.45, "pass8x16": 19.7, "overhead": 0.43}}]}}))
    out = tmp_path / "trace.json"
    done = subprocess.run(
        [sys.executable, "scripts/round_trace.py", "--workload", "resources/workloads/copy-heavy.jsonl",
         "--streams", "2", "--repeats", "1", "--max-tokens", "24", "--cells", "on", "--accelerator",
         "--costs", str(tmp_path / "h100.json"), "--json", str(out)], cwd=root, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    traced = json.loads(out.read_text())
    (run,) = traced["runs"]["on"]
    assert run["observed_ms"] == pytest.approx(device) and traced["costs_ms"] == pytest.approx(device)
    assert run["model_ms"]["overhead"] == pytest.approx(0.43) and run["drafting"]["accepted"] > 0


def test_round_trace_samples_and_times_mlx_lms_sampler(tmp_path: Path) -> None:
    """With ``--temperature`` the Lanes cells sample (on the device, their rounds run ahead with the
    GPU's round logic) and an mlx-lm cell times mlx-lm's own sampler; without it, mlx-lm greedy."""
    root = Path(__file__).parent.parent
    out = tmp_path / "trace.json"
    args = [sys.executable, "scripts/round_trace.py", "--workload", "resources/workloads/copy-heavy.jsonl",
            "--streams", "2", "--repeats", "1", "--max-tokens", "16", "--accelerator", "--json", str(out)]
    done = subprocess.run([*args, "--cells", "mlx-lm-batch,plain,on", "--temperature", "0.7", "--top-p", "0.9"],
                          cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(out.read_text())["runs"]
    assert runs["mlx-lm-batch"][0]["tok_s"] > 0 and runs["mlx-lm-batch"][0]["rounds"] == 0
    assert runs["plain"][0]["ahead"]["n"] > 0  # sampled rounds ran ahead
    assert "plain/mlx-lm-batch per repeat" in done.stdout
    greedy = subprocess.run([*args, "--cells", "mlx-lm,plain"], cwd=root, capture_output=True, text=True, timeout=600)
    assert greedy.returncode == 0, greedy.stderr[-2000:]
    assert json.loads(out.read_text())["runs"]["mlx-lm"][0]["tok_s"] > 0 and "plain/mlx-lm per repeat" in greedy.stdout


def test_engine_steps_time_batch_generate_and_plain_on_a_workload(loaded) -> None:
    parts = _script().engine_steps(loaded, 2, 4, Path("resources/workloads/mixed.jsonl"))
    assert set(parts) == {"mlx-lm-batch", "plain"}
    for p in parts.values():
        assert p["step"] > 0 and p["tok_s"] > 0 and p["model"] > 0


def test_draft_replay_copies_a_reply_that_repeats_its_prompt(loaded) -> None:
    """A reply that re-emits its prompt's text is mostly copied, and every reference token is either
    copied or the model's own (one a round)."""
    tok = loaded.tokenizer
    text = "The quick brown fox jumps over the lazy dog near the quiet river bank at dawn, every day."
    prompt = list(tok.encode(f"Repeat this: {text}"))
    reference = list(tok.encode(f"Sure: {text} Done."))
    costs = CostModel({(1, 1): 0.007, (1, 8): 0.0075, (4, 1): 0.009, (4, 8): 0.0095})
    replay = _load("draft_replay").replay
    for ahead in (False, True):
        run = replay([prompt], [reference], loaded.family, tok, costs, ahead, 0.007)
        (r,) = run.streams
        assert r.rounds + r.copied == len(reference)
        assert r.copied >= len(reference) // 2, r
        # An accelerator's rounds sorted as round_trace sorts real ones, and priced by kind.
        assert sum(run.round_kinds.values()) == (r.rounds if ahead else 0)
        if ahead:
            assert run.round_kinds["draft"] + run.round_kinds["dropped"] >= 1 and run.round_kinds["sync"] >= 1
            ms = {"ahead": 1.0, "continued": 3.0, "sync": 10.0, "draft": 100.0, "dropped": 1000.0}
            assert run.seconds(ms) == pytest.approx(sum(n * ms[k] for k, n in run.round_kinds.items()) / 1e3)
    # Beside a stream that never copies, the same reply in shared rounds: each stream's own tokens, and
    # the run's rounds those of the longer reply (a round drafts when either stream does).
    other = list(tok.encode("A short answer that repeats nothing from the question at all."))
    both = replay([prompt, prompt], [reference, other], loaded.family, tok, costs, True, 0.007)
    assert [s.rounds + s.copied for s in both.streams] == [len(reference), len(other)]
    assert both.streams[1].copied == 0
    assert sum(both.round_kinds.values()) == max(s.rounds for s in both.streams)


def test_draft_replay_reads_a_bench_result() -> None:
    assert doctest.testmod(_load("draft_replay")).failed == 0  # --round-ms' kinds
    root = Path(__file__).parent.parent
    done = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/gpu-alone-1-copy-heavy.json", "--ahead"],
                          cwd=root, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.startswith("rename-variable: 256 tokens in ") and "copied" in done.stdout
    timed = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/gpu-alone-1-copy-heavy.json", "--ahead",
                            "--round-ms", "ahead=5,sync=14,draft=10,dropped=12"], cwd=root, capture_output=True,
                           text=True, timeout=300)
    assert timed.returncode == 0 and "  rounds: ahead " in timed.stdout and timed.stdout.endswith(" ms\n"), timed.stderr[-2000:]
    assert ", continued " in timed.stdout  # rounds run ahead with copies' continuations, a kind of their own
    together = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/gpu-fused-copy-heavy.json", "--ahead",
                               "--together"], cwd=root, capture_output=True, text=True, timeout=300)
    assert together.returncode == 0 and together.stdout.count(" tokens in ") == 4, together.stderr[-2000:]
    assert together.stdout.count("shared rounds: ") == 1
    for bad in (["--round-ms", "ahead=5,sync=14,draft=10,dropped=12"], ["--ahead", "--round-ms", "ahead=5"]):
        refused = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/gpu-alone-1-copy-heavy.json", *bad],
                                 cwd=root, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and "--round-ms" in refused.stderr
    for cell, why in (("plain", "drafting cell"), ("on:start_copies=false", "engine settings"), ("on:bogus=1", "bogus")):
        refused = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/gpu-alone-1-copy-heavy.json",
                                  "--cell", cell], cwd=root, capture_output=True, text=True, timeout=300)
        assert refused.returncode == 2 and why in refused.stderr, refused.stderr[-500:]


def test_draft_replay_prices_copies_as_a_cell_does_and_starts_a_lone_stream_s_probes() -> None:
    """``--cell off`` prices every copy at the fixed rate (here copying more of the lone copy-heavy
    reply of an H100 run than ``on``'s doubt prior lets it); a lone stream's probes started in rounds
    run ahead test the doubtful windows ``on`` otherwise prices out, in fewer rounds."""
    root = Path(__file__).parent.parent

    def replayed(*args: str) -> tuple[int, int]:  # (rounds, copied tokens) of the one reply
        done = subprocess.run([sys.executable, "scripts/draft_replay.py", "docs/bench/h100-1-copy-heavy.json",
                               "--ahead", *args], cwd=root, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        head = done.stdout.split(";")[0]  # "<id>: 256 tokens in R rounds, C copied"
        return int(head.split(" rounds")[0].split()[-1]), int(head.split(" copied")[0].split()[-1])

    on, waiting, fixed = replayed(), replayed("--no-probe-starts"), replayed("--no-probe-starts", "--cell", "off")
    assert on[0] < waiting[0] and on[1] > waiting[1]
    assert fixed[1] > waiting[1]


def test_gpu_bench_traces_this_tree_and_a_base_one(tmp_path: Path) -> None:
    """``gpu-bench.sh``'s trace step, on the CPU with this checkout's packages: round_trace.py runs in
    this tree and in a base tree (here HEAD's own files) in the order A, B, B, A, each run's rounds
    packed as JSON into OUT/traces.tar.xz with the CPUs it ran on; ``PAIRS`` repeats that order
    (without a base, this tree's runs); ``TRACE_PIN`` pins each run to the CPUs it names; with too
    little time left before ``DEADLINE`` nothing starts and the run still ends cleanly."""
    root = Path(__file__).parent.parent
    base = tmp_path / "base"
    base.mkdir()
    archive = subprocess.run(["git", "archive", "HEAD", "engine", "scripts", "resources"], cwd=root,
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "x", "-C", str(base)], input=archive, check=True)
    env = {**os.environ, "SITE": sysconfig.get_paths()["purelib"], "STEPS": "trace", "TRACES": "copy-heavy:1",
           "REPEATS": "1", "TRACE_TOKENS": "12", "BASE": str(base),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/gpu-bench.sh", str(tmp_path / "no-wheels"), str(tmp_path / "out")],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    trees = [line.rsplit(": ", 1)[1] for line in done.stdout.splitlines() if line.startswith("== trace copy-heavy at 1")]
    assert trees == [".", str(base), str(base), "."]
    assert done.stdout.count("on/plain per repeat") == 4, done.stdout
    with tarfile.open(tmp_path / "out" / "traces.tar.xz") as packed:  # each run's rounds come back, in one file
        kept = sorted(m.name.removeprefix("./") for m in packed.getmembers() if m.isfile())
        assert kept == [f"trace-copy-heavy-1-{n}-{side}.json" for n, side in ((1, "tree"), (2, "base"), (3, "base"), (4, "tree"))]
        for name in kept:
            member = packed.extractfile(f"./{name}")
            assert member is not None
            data = json.loads(member.read())
            runs = data["runs"]
            assert set(runs) == {"plain", "on"} and all(r[0]["trace"] for r in runs.values())
            assert data["cpus"] == (sorted(os.sched_getaffinity(0)) if LINUX else None)
    assert not list((tmp_path / "out").glob("trace*.json")) and not (tmp_path / "out" / "traces").exists()
    alone = {k: v for k, v in env.items() if k != "BASE"}
    pin = min(os.sched_getaffinity(0)) if LINUX else None  # TRACE_PIN (taskset): each run on that CPU alone
    twice = subprocess.run(["bash", "scripts/gpu-bench.sh", str(tmp_path / "no-wheels"), str(tmp_path / "twice")],
                           cwd=root, env={**alone, "PAIRS": "2", **({"TRACE_PIN": str(pin)} if LINUX else {})},
                           capture_output=True, text=True, timeout=900)
    assert twice.returncode == 0, twice.stderr[-2000:]
    assert twice.stdout.count("== trace copy-heavy at 1 streams: .") == 2  # PAIRS repeats the order
    with tarfile.open(tmp_path / "twice" / "traces.tar.xz") as packed:
        names = sorted(m.name.removeprefix("./") for m in packed.getmembers() if m.isfile())
        assert names == ["trace-copy-heavy-1-1-tree.json", "trace-copy-heavy-1-2-tree.json"]
        assert all(json.loads(packed.extractfile(f"./{n}").read())["cpus"] == ([pin] if LINUX else None) for n in names)
    late = subprocess.run(["bash", "scripts/gpu-bench.sh", str(tmp_path / "no-wheels"), str(tmp_path / "out")],
                          cwd=root, env={**env, "DEADLINE": "30"}, capture_output=True, text=True, timeout=120)
    assert late.returncode == 0 and "== trace" not in late.stdout and "left before DEADLINE" in late.stderr


def test_gpu_bench_runs_the_bfloat16_model_with_cudnn_attention_off(tmp_path: Path) -> None:
    """``gpu-bench.sh``'s ``bf16`` step, on the CPU with this checkout's packages: the 8-bit bfloat16
    folder through copy-heavy at one and four streams and no-copy at four, each run recording that
    MLX's cuDNN attention was off, as Lanes sets it where the environment does not."""
    root = Path(__file__).parent.parent
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLX_")}
    env.update({"SITE": sysconfig.get_paths()["purelib"], "STEPS": "bf16", "ROUNDS": "1", "MAX_TOKENS": "6",
                "CELLS": "plain,on", "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    out = tmp_path / "out"
    done = subprocess.run(["bash", "scripts/gpu-bench.sh", str(tmp_path / "no-wheels"), str(out)],
                          cwd=root, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {p.name: json.loads(p.read_text()) for p in out.glob("gpu-*.json")}
    assert set(runs) == {"gpu-bf16-1-copy-heavy.json", "gpu-bf16-copy-heavy.json", "gpu-bf16-no-copy.json"}
    for name, r in runs.items():
        assert r["machine"]["mlx_env"] == {"MLX_CUDA_USE_CUDNN_SDPA": "0", "MLX_ENABLE_CACHE_THRASHING_CHECK": "0"}, name
        assert r["streams"] == (1 if "-1-" in name else 4) and all(c["equal_streams"] == r["streams"]
                                                                   for c in r["cells"].values()), name
    assert not (out / "embedded-8bit").exists()


def test_gpu_bench_runs_one_stream_with_the_cells_asked_for(tmp_path: Path) -> None:
    """``gpu-bench.sh``'s ``streams`` step at one stream runs ``CELLS`` with mlx-lm for mlx-lm-batch
    (one stream's baseline), so an A/B cell runs beside them there too."""
    done, out = _gpu_bench(tmp_path, STEPS="streams", STREAM_COUNTS="1", ROUNDS="1", MAX_TOKENS="6",
                           CELLS="mlx-lm-batch,plain,on:probe_starts=false")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {p.name: json.loads(p.read_text()) for p in out.glob("gpu-*.json")}
    assert set(runs) == {"gpu-1-copy-heavy.json", "gpu-1-no-copy.json"}
    for name, r in runs.items():
        assert r["streams"] == 1 and set(r["cells"]) == {"mlx-lm", "plain", "on:probe_starts=false"}, name


def test_gpu_bench_leaves_the_kernels_it_compiled_for_the_next_lease(tmp_path: Path) -> None:
    """``gpu-bench.sh`` on a machine whose ``nvidia-smi`` names an architecture leaves MLX's kernel cache
    ($TMPDIR/mlx/<version>/ptx) in OUT, named by MLX's version and that architecture; ``PTX_CACHE``
    puts such a file back on a fresh machine, and one of another version or architecture is refused
    by name. Without a GPU nothing is left."""
    import mlx.core as mx

    root = Path(__file__).parent.parent
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 9.0\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    # STEPS of a blank runs no step (an empty one would run the default ones): only the set-up and exit
    env = {**os.environ, "SITE": sysconfig.get_paths()["purelib"], "STEPS": " ",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def bench(out: str, tmp: str, gpu: bool, **more: str) -> subprocess.CompletedProcess[str]:
        path = f"{bin_dir}:{env['PATH']}" if gpu else env["PATH"]
        done = subprocess.run(["bash", "scripts/gpu-bench.sh", "-", str(tmp_path / out)], cwd=root,
                              env={**env, "PATH": path, "TMPDIR": str(tmp_path / tmp), **more},
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    kernels = tmp_path / "lease1" / "mlx" / mx.__version__ / "ptx"
    kernels.mkdir(parents=True)
    (kernels / "gemv.ptx").write_bytes(b"\x7fELF cubin")
    bench("cpu", "lease1", gpu=False)
    assert not any((tmp_path / "cpu").iterdir())
    bench("out1", "lease1", gpu=True)
    left = tmp_path / "out1" / f"ptx-cache-mlx{mx.__version__}-sm90.tar.xz"
    assert [p.name for p in (tmp_path / "out1").iterdir()] == [left.name]

    (tmp_path / "lease2").mkdir()
    back = bench("out2", "lease2", gpu=True, PTX_CACHE=str(left))
    assert f"kernels from {left}" in back.stdout
    assert (tmp_path / "lease2" / "mlx" / mx.__version__ / "ptx" / "gemv.ptx").read_bytes() == b"\x7fELF cubin"

    other = tmp_path / "ptx-cache-mlx0.0.1-sm80.tar.xz"
    other.write_bytes(left.read_bytes())
    (tmp_path / "lease3").mkdir()
    refused = bench("out3", "lease3", gpu=True, PTX_CACHE=str(other))
    assert "is not this machine's" in refused.stderr and not (tmp_path / "lease3" / "mlx").exists()


def test_gpu_bench_goes_on_after_a_step_fails(tmp_path: Path) -> None:
    """A failing step says so and the steps after it still run: a lease is one device call, and on
    the H100 three failed family tests once ended the run before its ``tiny`` step. Here a tree whose
    family tests fail runs ``families`` twice: both run, each reporting the failure test by test (a
    run cut at DEADLINE still says which passed), and the script ends cleanly."""
    root = Path(__file__).parent.parent
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    (tree / "tests").mkdir()
    (tree / "scripts" / "gpu-bench.sh").write_text((root / "scripts" / "gpu-bench.sh").read_text())
    (tree / "tests" / "test_families.py").write_text("def test_fails():\n    assert False\n")
    (tree / "tests" / "test_lane_attention.py").write_text("def test_passes():\n    pass\n")
    env = {**os.environ, "SITE": sysconfig.get_paths()["purelib"], "STEPS": "families families",
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    done = subprocess.run(["bash", "scripts/gpu-bench.sh", "-", str(tmp_path / "out")], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("1 failed") == 2, done.stdout
    assert done.stdout.count("test_families.py::test_fails FAILED") == 2
    assert done.stdout.count("test_lane_attention.py::test_passes PASSED") == 2
    assert done.stdout.count("(family tests failed or were cut at DEADLINE: the steps after them still run)") == 2


def test_pass_widths_times_a_pass_by_part_at_each_width(loaded) -> None:
    """``scripts/pass_widths.py``: a pass of one and of eight rows per stream, each part timed; a
    wider pass builds the same graph, so its build time is of the same order, not zero."""
    script = _load("pass_widths")
    lanes = script._lanes(loaded, 2)
    for width, pending in ((1, False), (8, False), (1, True)):
        r = script.pass_times(loaded, lanes, width, 2, pending)
        assert set(r) == {"build", "dispatch", "piped", "sync"}
        assert 0 < r["build"] < r["sync"] and r["dispatch"] > 0 and r["piped"] > 0
    assert lanes.lengths == [300, 293]  # every pass wrote the same positions: nothing advanced


def test_pass_widths_times_each_quantized_layer_shape_once() -> None:
    import mlx.nn as nn

    model = nn.Sequential(nn.Linear(64, 128), nn.Linear(128, 64), nn.Linear(64, 128))
    nn.quantize(model, group_size=32, bits=4)
    r = _load("pass_widths").matmul_times(model, [1, 8], calls=2)
    assert [(m["in"], m["out"], m["rows"]) for m in r] == [(64, 128, 1), (64, 128, 8), (128, 64, 1), (128, 64, 8)]
    assert all(m["quantized_us"] > 0 and m["dequantized_us"] > 0 and m["bits"] == 4 for m in r)


def test_gpu_bench_times_passes_by_width_into_a_file(tmp_path: Path) -> None:
    """``gpu-bench.sh``'s ``widths`` step runs ``scripts/pass_widths.py`` at the streams and widths
    asked for, as a round and queued at device offsets, and leaves its lines in OUT/widths.txt."""
    done, out = _gpu_bench(tmp_path, STEPS="widths", WIDTH_STREAMS="1", WIDTHS="1,3", WIDTH_STEPS="2")
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (out / "widths.txt").read_text().splitlines()
    kinds = [line.split()[:2] for line in lines if line.startswith(("pass", "pending"))]
    assert kinds == [["pass", "1x1"], ["pending", "1x1"], ["pass", "1x3"], ["pending", "1x3"]], lines


def test_gpu_bench_runs_cuda_graphs_on_and_off_in_alternate_processes(tmp_path: Path) -> None:
    """``gpu-bench.sh``'s ``graphs`` step: `pass_widths.py` and copy-heavy at one stream in four
    processes, MLX's CUDA graphs on, off, off, on (on a CPU the setting is read and changes
    nothing), each run's JSON recording the setting it ran under and its lines in OUT/graphs.txt."""
    done, out = _gpu_bench(tmp_path, STEPS="graphs", WIDTHS="1", WIDTH_STEPS="1", ROUNDS="1", MAX_TOKENS="4",
                           CELLS="plain")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {p.name: json.loads(p.read_text()) for p in out.glob("gpu-graphs*.json")}
    assert sorted(runs) == [f"gpu-graphs{g}-{n}-1-copy-heavy.json" for n, g in ((2, 0), (3, 0), (1, 1), (4, 1))]
    for name, r in runs.items():
        assert r["machine"]["mlx_env"]["MLX_USE_CUDA_GRAPHS"] == name[len("gpu-graphs")], name
        assert r["streams"] == 1 and set(r["cells"]) == {"plain"}
    lines = (out / "graphs.txt").read_text().splitlines()
    heads = [line for line in lines if line.startswith("== ")]
    assert heads == [f"== MLX_USE_CUDA_GRAPHS={g} ({n})" for n, g in enumerate((1, 0, 0, 1), start=1)]
    assert sum(line.startswith(("pass 1x1", "pending 1x1")) for line in lines) == 8


def test_pass_widths_times_projections_in_the_dtype_the_model_computes_in() -> None:
    """The embedded model's scales are float16 but its float32 norms make every projection's input
    float32: the kernels timed are those the model runs (a model laid out otherwise: its scales')."""
    import mlx.core as mx
    import mlx.nn as nn

    from engine.model.gguf import load_gguf
    from engine.model.locate import embedded_model_path

    script = _load("pass_widths")
    model, _, _ = load_gguf(embedded_model_path(), quantized=True)
    assert model.model.layers[0].self_attn.q_proj.scales.dtype == mx.float16
    assert script.activation_dtype(model) == mx.float32
    assert script.activation_dtype(nn.Sequential(nn.Linear(2, 2))) is None


def test_gpu_bench_runs_mlx_graphs_of_more_kernels_in_alternate_processes(tmp_path: Path) -> None:
    """``gpu-bench.sh``'s ``buffers`` step: copy-heavy in four processes, MLX's own limit on kernels
    a CUDA graph records, BUFFER_OPS, BUFFER_OPS, MLX's again (on a CPU the setting is read and
    changes nothing), each run's JSON recording the setting it ran under, one given to the shell
    left out of MLX's runs."""
    done, out = _gpu_bench(tmp_path, STEPS="buffers", BUFFER_OPS="50", BUFFER_STREAMS="1", ROUNDS="1",
                           MAX_TOKENS="4", CELLS="plain", MLX_MAX_OPS_PER_BUFFER="7")
    assert done.returncode == 0, done.stderr[-2000:]
    runs = {p.name: json.loads(p.read_text()) for p in out.glob("gpu-buffers*.json")}
    assert sorted(runs) == sorted(f"gpu-buffers{b}-{n}-1-copy-heavy.json"
                                  for n, b in enumerate(("default", "50", "50", "default"), start=1))
    for name, r in runs.items():
        assert r["machine"]["mlx_env"].get("MLX_MAX_OPS_PER_BUFFER") == (None if "default" in name else "50"), name
        assert r["streams"] == 1 and set(r["cells"]) == {"plain"}
