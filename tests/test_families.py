"""Every cache kind, rolled back per stream: tiny random-weight models of seven mlx-lm architectures
(engine/made_models.py), and the embedded model's real weights in mlx-lm's qwen2 module, loaded from mlx-lm folders, answer token for token as mlx-lm's own
``stream_generate`` under adversarial drafts, with streams joining, being cancelled and failing,
and follow-up turns reusing their caches."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path

import pytest
from mlx_lm import stream_generate
from mlx_lm.models.cache import ArraysCache

import engine.rounds.scheduler as scheduler_mod
from engine.bench.runner import top2_margin
from engine.errors import ModelLoadError
from engine.events import Event, Failed, Finished, Request
from engine.model import made_models
from engine.model.loading import LoadedModel, load_model
from engine.passes.choice import accelerator
from engine.rounds.scheduler import Scheduler
from engine.rounds.stream import Stream
from tests import prompts
from tests.test_fidelity import adversarial_proposer, random_allocator

pytestmark = pytest.mark.model

# What each architecture's cached layers hold: K plain KV, W sliding-window KV, R recurrent state
# whose mixer honours mlx-lm's mask (replayed in one batch), A recurrent replayed a stream at a time.
LAYOUTS = {
    "qwen3": "KK",
    "gemma3_text": "WWK",
    "gpt_oss": "WK",
    "lfm2": "RKR",
    "qwen3_next": "RKRK",
    "nemotron_h": "AKA",
    "mamba2": "RR",
    "embedded-as-qwen2": "K" * 30,
}
MAX = 24


def layout(model: LoadedModel) -> str:
    return "".join(("R" if k.masked else "A") if k.recurrent else ("W" if k.window else "K") for k in model.kinds)


@pytest.fixture(scope="module", params=list(LAYOUTS))
def tiny(request, loaded, tmp_path_factory) -> LoadedModel:
    return load_model(str(made_models.make(request.param, tmp_path_factory.mktemp(request.param), loaded)))


def ref(model: LoadedModel, prompt: list[int], max_tokens: int) -> list[int]:
    return [r.token for r in stream_generate(model.model, model.tokenizer, prompt, max_tokens=max_tokens)
            if r.finish_reason != "stop"]


# On an accelerator other batch shapes round differently, so a stream may leave mlx-lm's where its
# top two logits are closer than this (docs/benchmarks.md, Fidelity); on the CPU every token is equal.
NEAR_TIE = 0.05


def same_as_mlx_lm(model: LoadedModel, prompt: list[int], got: list[int], want: list[int]) -> None:
    """``got`` equals mlx-lm's ``want``: exactly on the CPU, up to a near-tie on an accelerator."""
    if got == want:
        return
    at = next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b), min(len(got), len(want)))
    margin = top2_margin(model, prompt, want, at) if at < len(want) else float("inf")
    assert model.device != "cpu" and margin < NEAR_TIE, (
        f"{model.name}: differs from mlx-lm at token {at} of {len(want)} (mlx-lm's top-2 margin there {margin:.4f})")


def chat(model: LoadedModel, text: str) -> list[int]:
    return list(model.tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True))


def test_each_family_loads_with_its_cache_kinds(tiny: LoadedModel, monkeypatch, tmp_path: Path) -> None:
    """From its folder, and from the Hugging Face cache's layout under a repo name, offline."""
    arch = tiny.model.args.model_type
    assert layout(tiny) in (LAYOUTS.get(arch), LAYOUTS["embedded-as-qwen2"])
    assert tiny.family.own_copy_rates == (arch == "lfm2")  # the seed's change: LFM2 turns it on
    snapshot = tmp_path / f"models--lanes-test--{arch}" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for f in tiny.path.iterdir():
        (snapshot / f.name).symlink_to(f)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text("0123abcd")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    cached = load_model(f"lanes-test/{arch}")
    assert cached.path == snapshot and cached.kinds == tiny.kinds


@pytest.mark.parametrize(("seed", "accelerated"), [(1, False), (2, False), (1, True)])
def test_greedy_equals_mlx_lm_under_adversarial_drafts(tiny: LoadedModel, monkeypatch, seed: int,
                                                       accelerated: bool) -> None:
    """Windows of every source, right, half right and wrong, granted at random; streams join while
    others run, one is cancelled mid-reply and one fails in its verification: every other stream
    equals mlx-lm, and each one's caches hold exactly its accepted tokens after every round.
    ``accelerated``: with a GPU's passes (run ahead, compiled where no layer is recurrent)."""
    if accelerated:
        tiny = replace(tiny, passes=accelerator(tiny.model, tiny.kinds))
        assert (tiny.passes.compiled is None) == any(k.recurrent for k in tiny.kinds)
    rng = random.Random(seed)
    texts = [prompts.COPY, prompts.FRANCE, prompts.CODE, prompts.OPEN, prompts.TYPOS]
    rng.shuffle(texts)
    refs: dict[str, list[int]] = {}
    eos = next(iter(tiny.tokenizer.eos_token_ids))
    monkeypatch.setattr(Stream, "propose", adversarial_proposer(rng, refs, len(tiny.tokenizer), eos))
    monkeypatch.setattr(scheduler_mod, "allocate", random_allocator(rng))
    reqs = [Request(prompt_tokens=tuple(chat(tiny, t)), max_tokens=MAX) for t in texts]
    for r in reqs:
        refs[r.id] = ref(tiny, list(r.prompt_tokens or ()), MAX)
    doomed, failing = reqs[-2].id, reqs[-1].id
    accept = Stream.accept

    def accept_or_fail(self: Stream, *args, **kwargs):
        if self.id == failing and len(self.output) >= 2:
            raise RuntimeError("injected")
        return accept(self, *args, **kwargs)

    monkeypatch.setattr(Stream, "accept", accept_or_fail)
    events: list[Event] = []
    sched = Scheduler(tiny, events.append)
    pending = list(reqs)
    sched.submit(pending.pop(0))
    steps = 0
    while sched.busy or pending:
        if pending and rng.random() < 0.4:
            sched.submit(pending.pop(0))
        sched.step()
        steps += 1
        for row, s in enumerate(sched.active):
            assert sched.lanes.lengths[row] == len(s.prompt) + len(s.output) - 1
            if s.id == doomed and len(s.output) >= 4:
                sched.cancel(doomed)
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    failed = {e.request_id: e for e in events if isinstance(e, Failed)}
    assert set(failed) == {failing} and "injected" in failed[failing].message
    assert done[doomed].reason == "cancelled"
    cut = len(done[doomed].tokens)
    same_as_mlx_lm(tiny, list(reqs[-2].prompt_tokens or ()), list(done[doomed].tokens), refs[doomed][:cut])
    for r in reqs[:-2]:
        same_as_mlx_lm(tiny, list(r.prompt_tokens or ()), list(done[r.id].tokens), refs[r.id])
    tested = sum(st.tested for d in done.values() for st in d.stats.rows.values())
    accepted = sum(st.accepted for d in done.values() for st in d.stats.rows.values())
    assert 0 < accepted < tested  # drafts landed and drafts were rejected: rollback ran


def first_turn(sched: Scheduler, events: list[Event], prompt: list[int], max_tokens: int) -> list[int]:
    """Run conversation "c1"'s first turn to its end; returns its reply's tokens."""
    sched.submit(Request(prompt_tokens=tuple(prompt), max_tokens=max_tokens, conversation="c1"))
    while sched.busy:
        sched.step()
    return list(next(e for e in events if isinstance(e, Finished)).tokens)


def test_follow_up_turns_reuse_every_kind_of_cache(tiny: LoadedModel) -> None:
    """A conversation's second turn starts from the first turn's caches (recurrent states too) and
    still equals mlx-lm's answer to the whole prompt."""
    events: list[Event] = []
    sched = Scheduler(tiny, events.append)
    first = chat(tiny, prompts.CODE)
    reply = first_turn(sched, events, first, 12)
    follow = [*first, *reply, *chat(tiny, prompts.FRANCE)[1:]]
    sched.submit(Request(prompt_tokens=tuple(follow), max_tokens=12, conversation="c1"))
    while sched.busy:
        sched.step()
    second = [e for e in events if isinstance(e, Finished)][-1]
    assert second.stats.prefill_reused == len(first) + len(reply) - 1
    same_as_mlx_lm(tiny, follow, list(second.tokens), ref(tiny, follow, 12))


@pytest.mark.parametrize("accelerated", [False, True])
def test_prompts_joining_together_share_a_pass_and_stay_equal(tiny: LoadedModel, accelerated: bool) -> None:
    """Three chats sent at once, one of them a follow-up that starts from its first turn's caches,
    between two that start from nothing: their prompts are prefilled in one pass (engine.rounds.joins),
    and every reply equals mlx-lm's. ``accelerated``: with a GPU's passes."""
    if accelerated:
        tiny = replace(tiny, passes=accelerator(tiny.model, tiny.kinds))
    events: list[Event] = []
    sched = Scheduler(tiny, events.append)
    first = chat(tiny, prompts.FRANCE)
    reply = first_turn(sched, events, first, 6)
    follow = [*first, *reply, *chat(tiny, "And of Spain?")[1:]]
    reqs = [Request(prompt_tokens=tuple(chat(tiny, prompts.OPEN)), max_tokens=MAX),
            Request(prompt_tokens=tuple(follow), max_tokens=MAX, conversation="c1"),
            Request(prompt_tokens=tuple(chat(tiny, prompts.FRANCE)), max_tokens=MAX)]
    chunks = [len(follow) - (len(first) + len(reply) - 1), len(reqs[0].prompt_tokens or ()),
              len(reqs[2].prompt_tokens or ())]
    assert 3 * max(chunks) <= sched.prefill_pass  # all three fit one pass
    for r in reqs:
        sched.submit(r)
    sched.step()
    assert sched.prefills_joined == 1 and not sched.joining and len(sched.active) == 3
    for row, s in enumerate(sched.active):
        assert sched.lanes.lengths[row] == len(s.prompt) + len(s.output) - 1
    while sched.busy:
        sched.step()
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    assert done[reqs[1].id].stats.prefill_reused == len(first) + len(reply) - 1
    for r in reqs:
        prompt = list(r.prompt_tokens or ())
        same_as_mlx_lm(tiny, prompt, list(done[r.id].tokens), ref(tiny, prompt, MAX))


def test_real_weights_in_another_architecture_copy_and_stay_equal(loaded, tmp_path_factory) -> None:
    """The embedded model's weights in mlx-lm's qwen2 module (the generic pass, not llama's): the
    real proposer's copies land, and every token equals mlx-lm's."""
    qwen2 = load_model(str(made_models.make("embedded-as-qwen2", tmp_path_factory.mktemp("qwen2"), loaded)))
    assert type(qwen2.model).__module__ == "mlx_lm.models.qwen2"
    assert qwen2.passes.numpy_pass is None and not qwen2.passes.grouped  # llama's CPU passes do not apply
    copies_land_and_stay_equal(qwen2)


def copies_land_and_stay_equal(model: LoadedModel) -> list[tuple[list[int], list[int]]]:
    """Two copy-friendly requests side by side: every token equals mlx-lm's and copies land.
    Returns each request's prompt and reply."""
    events: list[Event] = []
    sched = Scheduler(model, events.append)
    reqs = [Request(prompt_tokens=tuple(chat(model, t)), max_tokens=48, own_copy_rates=False)
            for t in (prompts.COPY, prompts.CODE)]
    for r in reqs:
        sched.submit(r)
    while sched.busy:
        sched.step()
    done = {e.request_id: e for e in events if isinstance(e, Finished)}
    for r in reqs:
        prompt = list(r.prompt_tokens or ())
        same_as_mlx_lm(model, prompt, list(done[r.id].tokens), ref(model, prompt, 48))
    if model.device == "cpu":  # an accelerator prices copies by its own round costs: on an H100 these
        # two short replies landed 0 (qwen2) and 10 rows from a cold start; its copies are measured by
        # `lanes bench` there (docs/benchmarks.md), not here
        assert sum(done[r.id].stats.rows["context"].accepted for r in reqs) > 10
    return [(list(r.prompt_tokens or ()), list(done[r.id].tokens)) for r in reqs]


def test_the_embedded_model_as_a_llama_folder_runs_as_the_gguf_does(loaded, tmp_path_factory) -> None:
    """``make-model embedded-as-llama`` (what mlx_lm.server reads in ``make bench-server``): the same
    passes as the embedded GGUF, and every token equals mlx-lm's."""
    llama = load_model(str(made_models.make("embedded-as-llama", tmp_path_factory.mktemp("llama"), loaded)))
    assert type(llama.model).__module__ == "mlx_lm.models.llama"
    assert llama.passes.name == loaded.passes.name and (llama.passes.numpy_pass is None) == (
        loaded.passes.numpy_pass is None)
    events: list[Event] = []
    sched = Scheduler(llama, events.append)
    req = Request(prompt_tokens=tuple(chat(llama, prompts.COPY)), max_tokens=48, own_copy_rates=False)
    sched.submit(req)
    while sched.busy:
        sched.step()
    [done] = [e for e in events if isinstance(e, Finished)]
    prompt = list(req.prompt_tokens or ())
    same_as_mlx_lm(llama, prompt, list(done.tokens), ref(llama, prompt, 48))
    same_as_mlx_lm(loaded, prompt, list(done.tokens), ref(loaded, prompt, 48))  # the same model


def _stored_dtypes(folder: Path) -> set[str]:
    import mlx.core as mx

    return {str(a.dtype) for f in folder.glob("*.safetensors") for a in mx.load(str(f)).values()}


def test_the_embedded_model_as_mlx_community_ships_it_copies_and_stays_equal(loaded, tmp_path_factory) -> None:
    """``make-model embedded-8bit``: the embedded weights stored bfloat16 and 8-bit in groups of 64,
    as mlx-community's folders are (so a GPU computes it in bfloat16, as it does the models people
    run); on the CPU it loads dequantized like any such folder, the real proposer's copies land,
    every token equals mlx-lm's, and the replies are the embedded model's own (at 4 bits they were
    not: its weights are 4-bit already)."""
    folder = made_models.make("embedded-8bit", tmp_path_factory.mktemp("embedded-8bit"), loaded)
    config = json.loads((folder / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16"
    assert (config["quantization"]["bits"], config["quantization"]["group_size"]) == (8, 64)
    assert _stored_dtypes(folder) == {"mlx.core.bfloat16", "mlx.core.uint32"}
    model = load_model(str(folder))
    assert type(model.model).__module__ == "mlx_lm.models.llama"
    for prompt, reply in copies_land_and_stay_equal(model):
        assert reply == ref(loaded, prompt, 48)


def test_a_recurrent_state_is_not_reused_past_where_the_prompts_part() -> None:
    """A recurrent state cannot be trimmed: a turn whose prompt leaves the cached tokens early
    prefills afresh instead of reusing a state that holds tokens it does not have."""
    from engine.model.turn_cache import ConversationCache

    cache = ConversationCache()
    state = ArraysCache(1)
    cache.put("c", [1, 2, 3, 4], [state])
    assert cache.take("c", [1, 2, 9, 9, 9]) is None
    cache.put("c", [1, 2, 3, 4], [state])
    taken = cache.take("c", [1, 2, 3, 4, 5])
    assert taken is not None and taken[1] == 4


def test_an_unsupported_cache_kind_is_refused_naming_the_family(loaded, tmp_path: Path) -> None:
    """llama4's chunked attention cache cannot be rolled back per stream: refused at load, naming it."""
    from engine.model.cache_kinds import layer_kinds

    class Chunked:
        args = type("Args", (), {"model_type": "llama4"})()
        layers = [0]

        def make_cache(self):
            from mlx_lm.models.cache import ChunkedKVCache

            return [ChunkedKVCache(8)]

    with pytest.raises(ModelLoadError, match=r"llama4.*ChunkedKVCache"):
        layer_kinds(Chunked(), "tiny-llama4")  # type: ignore[arg-type]


def test_a_rope_that_takes_no_position_per_stream_is_refused_at_load(loaded, tmp_path: Path) -> None:
    """mlx-lm's DynamicNTKScalingRoPE sizes its table from the offset: with one offset per stream it
    raises. Lanes finds that at load, naming the rope, instead of in the first shared round."""
    import mlx.core as mx
    from mlx_lm.models import llama
    from mlx_lm.utils import save_config, save_model

    config = dict(model_type="llama", hidden_size=32, num_hidden_layers=1, intermediate_size=48,
                  num_attention_heads=2, num_key_value_heads=1, rms_norm_eps=1e-5, vocab_size=made_models.VOCAB,
                  rope_scaling={"type": "dynamic", "factor": 2.0}, max_position_embeddings=4096,
                  tie_word_embeddings=True)
    model = llama.Model(llama.ModelArgs.from_dict(config))
    mx.eval(model.parameters())
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    loaded.tokenizer._tokenizer.save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="DynamicNTKScalingRoPE"):
        load_model(str(tmp_path))


def test_a_4_bit_hybrid_model_loads_and_stays_equal(loaded, tmp_path: Path) -> None:
    """mlx-lm's 4-bit quantization of a hybrid model (conv layers and attention): loaded as such a
    folder is (on the CPU dequantized, on a GPU kept 4-bit), drafted, and token-equal to mlx-lm."""
    import importlib

    import mlx.core as mx
    from mlx_lm.utils import quantize_model, save_config, save_model

    lfm2 = importlib.import_module("mlx_lm.models.lfm2")
    config = dict(made_models.RANDOM["lfm2"])
    mx.random.seed(5)
    model, config = quantize_model(lfm2.Model(lfm2.ModelArgs.from_dict(config)), config, 32, 4)
    save_model(tmp_path, model)
    save_config(config, tmp_path / "config.json")
    loaded.tokenizer._tokenizer.save_pretrained(tmp_path)
    quantized = load_model(str(tmp_path))
    assert layout(quantized) == LAYOUTS["lfm2"]
    events: list[Event] = []
    sched = Scheduler(quantized, events.append)
    req = Request(prompt_tokens=tuple(chat(quantized, prompts.COPY)), max_tokens=MAX)
    sched.submit(req)
    while sched.busy:
        sched.step()
    done = next(e for e in events if isinstance(e, Finished))
    prompt = list(req.prompt_tokens or ())
    same_as_mlx_lm(quantized, prompt, list(done.tokens), ref(quantized, prompt, MAX))


def test_the_1b_shape_has_llama_3_2_1b_s_size_and_quantizes_as_mlx_lm_does(loaded, tmp_path: Path) -> None:
    """``lanes make-model llama-1b-4bit``'s shape: Llama-3.2-1B's 973M parameters outside the
    embedding, and 1.07B with the embedded tokenizer's vocabulary (its own 128,256 make 1.24B),
    counted without computing a weight; and a shaped model of the same recipe, made small, is
    stored bfloat16 and 4-bit, loads from its folder and runs."""
    from mlx.utils import tree_flatten
    from mlx_lm.models import llama

    config, bits = made_models.SHAPED["llama-1b-4bit"]
    lazy = llama.Model(llama.ModelArgs.from_dict(config))
    params = sum(v.size for _, v in tree_flatten(lazy.parameters()))
    assert params - made_models.VOCAB * 2048 == 973_146_112 and bits == 4
    small = dict(config, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32)
    folder = made_models.random_model(small, tmp_path / "small", loaded.tokenizer, bits=bits)
    assert json.loads((folder / "config.json").read_text())["quantization"]["bits"] == 4
    assert _stored_dtypes(folder) == {"mlx.core.bfloat16", "mlx.core.uint32"}  # as mlx-community's
    model = load_model(str(folder))
    events: list[Event] = []
    sched = Scheduler(model, events.append)
    req = Request(prompt_tokens=tuple(chat(model, prompts.COPY)), max_tokens=MAX)
    sched.submit(req)
    while sched.busy:
        sched.step()
    done = next(e for e in events if isinstance(e, Finished))
    prompt = list(req.prompt_tokens or ())
    same_as_mlx_lm(model, prompt, list(done.tokens), ref(model, prompt, MAX))
