"""Conversations' KV caches on disk (engine.model.kv_files): a long chat reopened in a new engine is
not prefilled again and still answers as mlx-lm does; deleting the conversation deletes its file;
a damaged file or another model's is ignored; the disk budget removes the least recently used."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache, save_prompt_cache

from engine.events import Finished, Request
from engine.model import kv_files
from engine.model.cache_kinds import LayerKind
from engine.model.kv_files import KvFile, KvFiles, to_evict
from engine.model.turn_cache import PREFIX, ConversationCache, common_prefix
from engine.rounds.engine_thread import Engine

SYSTEM = {"role": "system", "content": "You are a terse assistant. " + " ".join(
    f"Rule {i}: answer in one short sentence and never repeat the question." for i in range(40))}


# -- the budget, on literal data ---------------------------------------------------------------
def test_the_budget_removes_the_least_recently_used_files_first() -> None:
    """The worked example of ``to_evict``."""
    a, b, c = KvFile(Path("a"), 100, 1.0), KvFile(Path("b"), 300, 3.0), KvFile(Path("c"), 200, 2.0)
    assert to_evict([a, b, c], 400) == [a, c]
    assert to_evict([a, b, c], 600) == []
    assert to_evict([a, b, c], 500) == [a]
    assert to_evict([a, b, c], 0) == [a, c, b]
    assert to_evict([], 0) == []


def test_the_budget_counts_every_models_files_and_clears_stale_temporaries(tmp_path: Path) -> None:
    def file(rel: str, size: int, used: float) -> Path:
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"x" * size)
        os.utime(p, (used, used))
        return p

    old = file("m1/c1.safetensors", 100, 1000.0)
    other = file("m2/c2.safetensors", 300, 3000.0)
    mid = file("m1/c3.safetensors", 200, 2000.0)
    stale = file("m1/.c4.123.safetensors", 50, 10.0)  # a killed writer's, long ago
    fresh = file("m1/.c5.123.safetensors", 50, 4e9)  # a writer's at work now
    found = kv_files.scan(tmp_path)
    assert {f.path for f in found} == {old, other, mid}
    assert not stale.exists() and fresh.exists()
    assert [f.path for f in to_evict(found, 400)] == [old, mid]
    assert kv_files.remove_conversation(tmp_path, "c2") == 1 and not other.exists()


def test_file_names_are_the_key_or_its_hash() -> None:
    assert kv_files.file_name("c12") == "c12.safetensors"
    odd = kv_files.file_name("../etc/passwd")
    assert "/" not in odd and odd.endswith(".safetensors") and odd != kv_files.file_name("../etc/passwd2")


def test_lanes_delete_deletes_the_conversations_kv_files(tmp_path: Path) -> None:
    """``lanes delete`` runs no engine: it removes the files itself (every model's)."""
    from engine.store.store import Store
    from tests.test_store_cli import lanes

    with Store.open(tmp_path) as store:
        gone, kept = store.create_conversation(title="gone"), store.create_conversation(title="kept")
    files = [kv_files.folder(tmp_path) / m / kv_files.file_name(c.key) for m in ("m1", "m2") for c in (gone, kept)]
    for f in files:
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_bytes(b"kv")
    res = lanes(tmp_path, "delete", str(gone.id))
    assert res.returncode == 0, res.stderr
    assert [f.exists() for f in files] == [False, True, False, True]


# -- the memory tier's contract with the disk tier, on small caches ----------------------------
def caches(n: int, layers: int = 2) -> list[KVCache]:
    out = []
    for i in range(layers):
        c = KVCache()
        c.update_and_fetch(mx.full((1, 1, n, 4), float(i)), mx.full((1, 1, n, 4), -float(i)))
        out.append(c)
    return out


def test_unsaved_turns_are_written_when_asked_or_as_they_leave_memory(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(kv_files, "SAVE_FROM_TOKENS", 8)
    disk = KvFiles(tmp_path, "m", [LayerKind()] * 2)
    one = sum(c.nbytes for c in caches(16))
    cc = ConversationCache(max_bytes=int(one * 1.5), disk=disk)
    cc.put("short", list(range(4)), caches(4))  # under SAVE_FROM_TOKENS: memory only
    cc.put(PREFIX + "r1", list(range(16)), caches(16))  # the API's: memory only (evicts "short")
    assert not cc.unsaved
    cc.put("a", list(range(16)), caches(16))  # evicts r1
    assert cc.unsaved and not disk.path("a").exists()
    cc.put("b", list(range(16)), caches(16))  # evicts a: written as it leaves
    assert disk.path("a").exists() and not disk.path("b").exists()
    cc.save_all()
    assert disk.path("b").exists() and not cc.unsaved
    assert not disk.path("short").exists() and not list(tmp_path.glob("*/h*"))
    fresh = ConversationCache(disk=disk)
    got = fresh.take("a", [*range(10), 99])  # from disk, trimmed to the shared prefix
    assert got is not None and got[1] == 10 and all(c.offset == 10 for c in got[0])
    assert mx.array_equal(got[0][1].keys[..., :10, :], mx.full((1, 1, 10, 4), 1.0)).item()
    fresh.forget("b")
    fresh.put("b", list(range(20)), caches(20))  # a reply of the deleted conversation, ending after it
    assert len(fresh) == 0 and not fresh.unsaved


# -- the real model ----------------------------------------------------------------------------
def messages(turns: list[tuple[str, str]], question: str) -> tuple[dict[str, str], ...]:
    out = [SYSTEM]
    for q, a in turns:
        out += [{"role": "user", "content": q}, {"role": "assistant", "content": a}]
    return (*out, {"role": "user", "content": question})


def engine_on(loaded, kv: Path) -> Engine:
    return Engine(loader=lambda _spec: loaded, calibrate=False, kv_dir=kv)


def turn(engine: Engine, msgs: tuple[dict[str, str], ...], max_tokens: int = 12) -> Finished:
    done = engine.submit(Request(messages=msgs, max_tokens=max_tokens, conversation="c7")).wait()
    assert isinstance(done, Finished), done
    return done


def prompt_of(loaded, msgs: tuple[dict[str, str], ...]) -> list[int]:
    return list(loaded.tokenizer.apply_chat_template(list(msgs), add_generation_prompt=True))


def saved_tokens(path: Path) -> list[int]:
    return json.loads(kv_files.load_prompt_cache(str(path), return_metadata=True)[1]["tokens"])


@pytest.mark.model
def test_a_long_chat_reopened_in_a_new_engine_is_not_prefilled_again(loaded, reference, tmp_path: Path) -> None:
    """Two turns, the engine closed (writing the file), a new engine on the same folder: the third
    turn reuses every token the file holds that its prompt shares, and equals mlx-lm's reply."""
    kv = tmp_path / "kv"
    turns: list[tuple[str, str]] = []
    with engine_on(loaded, kv) as eng:
        first = turn(eng, messages(turns, "Name a lighthouse."))
        assert len(prompt_of(loaded, messages(turns, "x"))) >= kv_files.SAVE_FROM_TOKENS
        turns.append(("Name a lighthouse.", first.text))
        second = turn(eng, messages(turns, "Where is it?"))
        assert second.stats.prefill_reused > len(prompt_of(loaded, messages([], "Name a lighthouse."))) - 8
        turns.append(("Where is it?", second.text))
    [path] = list(kv.glob("*/c7.safetensors"))
    held = saved_tokens(path)
    msgs = messages(turns, "How tall is it?")
    prompt = prompt_of(loaded, msgs)
    shared = common_prefix(held, prompt)
    assert shared > 0.9 * len(held)
    with engine_on(loaded, kv) as eng:
        third = turn(eng, msgs, max_tokens=16)
    assert third.stats.prefill_reused == min(shared, len(prompt) - 1)  # read from the file, not prefilled
    assert list(third.tokens) == reference(prompt, 16)
    with engine_on(loaded, tmp_path / "elsewhere") as eng:  # no file: the whole prompt is read
        assert turn(eng, msgs, max_tokens=1).stats.prefill_reused == 0


@pytest.mark.model
def test_deleting_the_conversation_deletes_its_file(loaded, tmp_path: Path) -> None:
    kv = tmp_path / "kv"
    with engine_on(loaded, kv) as eng:
        turn(eng, messages([], "Name a lighthouse."), max_tokens=4)
        eng.run_sync(lambda s: s.conversations.save_all())
        [path] = list(kv.glob("*/c7.safetensors"))
        other_model = kv / "another-model" / "c7.safetensors"
        other_model.parent.mkdir()
        other_model.write_bytes(b"")
        eng.forget_conversation("c7").result(timeout=60)
        assert not path.exists() and not other_model.exists()
        assert len(eng.run_sync(lambda s: s.conversations)) == 0
    with engine_on(loaded, kv) as eng:  # a later turn of the deleted conversation finds nothing
        assert turn(eng, messages([], "Name a lighthouse."), max_tokens=1).stats.prefill_reused == 0
    assert path.exists()  # written again as that engine closed
    eng.forget_conversation("c7").result(timeout=5)  # the engine has stopped: removed here and now
    assert not path.exists()


@pytest.mark.model
def test_damaged_files_and_other_models_files_are_ignored_and_deleted(loaded, reference, tmp_path: Path,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(kv_files, "SAVE_FROM_TOKENS", 8)  # short prompts keep the five replies quick
    kv = tmp_path / "kv"
    msgs: tuple[dict[str, str], ...] = ({"role": "user", "content": "Name a lighthouse."},)
    with engine_on(loaded, kv) as eng:
        turn(eng, msgs, max_tokens=4)
    [path] = list(kv.glob("*/c7.safetensors"))
    good = path.read_bytes()
    caches, meta = kv_files.load_prompt_cache(str(path), return_metadata=True)
    mx.eval([c.state for c in caches])  # mx.load reads lazily: before the file is overwritten
    prompt = prompt_of(loaded, ({"role": "user", "content": "Name a lighthouse. A tall one."},))

    def other_model(p: Path) -> None:
        save_prompt_cache(str(p), caches, {**meta, "model": "0123456789abcdef"})

    def unknown_kind(p: Path) -> None:
        arrays, m = mx.load(str(p), return_metadata=True)
        mx.save_safetensors(str(p), arrays, {k: ("NoSuchCache" if v == "KVCache" else v) for k, v in m.items()})

    def too_few_layers(p: Path) -> None:
        save_prompt_cache(str(p), caches[:-1], meta)

    damage = {
        "garbage": lambda p: p.write_bytes(b"not a safetensors file"),
        "truncated": lambda p: p.write_bytes(good[: len(good) // 2]),
        "another model": other_model,
        "unknown cache kind": unknown_kind,
        "too few layers": too_few_layers,
    }
    with engine_on(loaded, kv) as eng:
        for why, spoil in damage.items():
            path.write_bytes(good)
            spoil(path)
            done = eng.submit(Request(prompt_tokens=tuple(prompt), max_tokens=8, conversation="c7")).wait()
            assert isinstance(done, Finished), why
            assert done.stats.prefill_reused == 0, why
            assert list(done.tokens) == reference(prompt, 8), why
            assert not path.exists() or path.read_bytes() != good, why  # deleted (or since rewritten)
            eng.run_sync(lambda s: s.conversations.drop("c7"))  # the next one reads the file again
        path.write_bytes(good)  # the undamaged file is used
        held = saved_tokens(path)
        done = eng.submit(Request(prompt_tokens=tuple(prompt), max_tokens=8, conversation="c7")).wait()
        assert isinstance(done, Finished) and done.stats.prefill_reused == common_prefix(held, prompt)
        assert done.stats.prefill_reused > 10
        assert list(done.tokens) == reference(prompt, 8)


@pytest.mark.model
def test_a_recurrent_models_state_is_saved_and_reused_across_engines(loaded, tmp_path_factory, monkeypatch) -> None:
    """LFM2 (short convolutions beside attention, tiny random weights): the file holds both kinds,
    and a follow-up turn in a new engine starts from it and equals mlx-lm."""
    from engine.model import made_models
    from engine.model.loading import load_model
    from tests import prompts
    from tests.test_families import chat, ref, same_as_mlx_lm

    monkeypatch.setattr(kv_files, "SAVE_FROM_TOKENS", 8)  # the tiny model's chats are short
    tiny = load_model(str(made_models.make("lfm2", tmp_path_factory.mktemp("lfm2"), loaded)))
    assert tiny.recurrent
    kv = tmp_path_factory.mktemp("kv")
    first = chat(tiny, prompts.CODE)
    with engine_on(tiny, kv) as eng:
        done = eng.submit(Request(prompt_tokens=tuple(first), max_tokens=12, conversation="c1")).wait()
    assert isinstance(done, Finished)
    follow = [*first, *done.tokens, *chat(tiny, prompts.FRANCE)[1:]]
    with engine_on(tiny, kv) as eng:
        second = eng.submit(Request(prompt_tokens=tuple(follow), max_tokens=12, conversation="c1")).wait()
    assert isinstance(second, Finished)
    assert second.stats.prefill_reused == len(first) + len(done.tokens) - 1
    same_as_mlx_lm(tiny, follow, list(second.tokens), ref(tiny, follow, 12))


@pytest.mark.model
def test_deleting_a_conversation_through_the_session_deletes_its_file(loaded, tmp_path: Path) -> None:
    """What the window and ``lanes chat`` do: ``ChatSession.delete_conversation`` forgets the KV cache too."""
    from engine.service.session import ChatSession, ReplySettings
    from engine.store.store import Store

    with Store(tmp_path / "lanes.db") as store, engine_on(loaded, tmp_path / "kv") as eng:
        session = ChatSession(store, eng, "m")
        conv = session.new_conversation(system_prompt=SYSTEM["content"])
        session.ask(conv.id, "Name a lighthouse.", ReplySettings(max_tokens=4))
        eng.run_sync(lambda s: s.conversations.save_all())  # what an idle engine does
        [path] = list((tmp_path / "kv").glob(f"*/{conv.key}.safetensors"))
        session.delete_conversation(conv.id)
        eng.run_sync(lambda s: None)  # the engine's commands run in order: the forget has run
        assert not path.exists()


@pytest.mark.model
def test_the_windows_service_keeps_a_long_chats_kv_beside_its_database(tmp_path: Path) -> None:
    """The window's ChatService on the real engine (its own default): a long chat's turn is written
    to the data folder's kv/ as the service closes, and deleting the conversation removes it."""
    from engine.service.chat_service import ChatService
    from engine.service.session import ReplySettings

    svc = ChatService(tmp_path / "lanes.db")
    conv = svc.store.submit(lambda s: s.create_conversation(system_prompt=SYSTEM["content"])).result()
    svc.start_reply(conv.id, "Name a lighthouse.", ReplySettings(max_tokens=4), lambda ev: None).done.result(120)
    svc.close()
    [path] = list((tmp_path / "kv").glob(f"*/{conv.key}.safetensors"))
    svc = ChatService(tmp_path / "lanes.db")
    try:
        svc.session_call(lambda cs: cs.delete_conversation(conv.id)).result(60)
        svc.engine.run_sync(lambda s: None)  # the engine's commands run in order: the forget has run
        assert not path.exists()
    finally:
        svc.close()
