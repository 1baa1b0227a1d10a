"""Transcripts: JSON export/import is lossless and all-or-nothing; Markdown and HTML are readable and safe."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from engine.errors import LanesError
from engine.store.records import ComparisonRun
from engine.store.render import conversation_to_html, conversation_to_markdown
from engine.store.store import Store
from engine.store.transcript import TranscriptError, conversation_to_json, import_conversation

ROOT = Path(__file__).resolve().parents[1]
STATS = {"prompt_tokens": 30, "generated": 6, "seconds": 0.5, "first_token_s": 0.12, "prefill_reused": 0,
         "rounds": 3, "rows": {"context": {"tested": 4, "accepted": 3, "granted": 5}}}


@pytest.fixture
def store(tmp_path: Path):
    with Store.open(tmp_path / "data") as s:
        yield s


def build(store: Store) -> int:
    """A conversation using every field the store keeps."""
    conv = store.create_conversation(
        title="Typos", model="SmolLM2-135M-Instruct", system_prompt="Be brief.",
        settings={"temperature": 0.0, "max_tokens": 64}, recallable=False, created_at=1_700_000_000.25,
    )
    cid = conv.id
    store.add_message(cid, "user", "Fix: teh cat <script>alert(1)</script>", created_at=1_700_000_001.5)
    store.add_message(cid, "assistant", "The cat.", stats=STATS, origins=["model", "context", "context", "recall"],
                      tokens=[504, 2368, 30, 7], tokens_model="SmolLM2", created_at=1_700_000_002.0,
                      updated_at=1_700_000_003.0)
    store.add_message(cid, "user", "Again, ünïcödé & more", created_at=1_700_000_010.0)
    store.add_message(cid, "assistant", "The c", status="partial", origins=["model"], tokens=[1],
                      created_at=1_700_000_011.0)
    store.add_message(cid, "assistant", "", status="error", error="out of memory <b>", created_at=1_700_000_012.0)
    store.save_copy_history(cid, {"context": {"accepted": 5.5, "tested": 7.25}, "recall": {"accepted": 1, "tested": 2}})
    rates = ({"round": 1, "source": "context", "rate": 0.75}, {"round": 3, "source": "recall", "rate": 0.5})
    runs = [  # two repeats, the order alternated; the last run was cancelled
        ComparisonRun("off", 0, 0, "The cat.", "complete", stats={**STATS, "tokens_per_s": 40.0},
                      origins=("model", "context"), tokens=(9, 10),
                      copy_history_after={"context": {"accepted": 1.0, "tested": 2.0}}),
        ComparisonRun("on", 0, 1, "The cat.", "complete", stats={**STATS, "tokens_per_s": 46.0},
                      origins=("model", "recall"), tokens=(9, 10), rates=rates),
        ComparisonRun("on", 1, 0, "The cat.", "complete", stats={**STATS, "tokens_per_s": 47.0},
                      origins=("context", "context"), tokens=(9, 10), rates=rates[:1],
                      copy_history_after={"recall": {"accepted": 0.5, "tested": 1.0}}),
        ComparisonRun("off", 1, 1, "The", "cancelled"),
    ]
    store.add_comparison([{"role": "user", "content": "Fix: teh"}], runs, conversation_id=cid,
                         settings={"temperature": 0.0, "repeats": 2}, model="SmolLM2",
                         copy_history={"context": {"accepted": 3.0, "tested": 4.0}}, status="cancelled",
                         created_at=1_700_000_020.0)
    store.db.execute("UPDATE conversations SET updated_at = ? WHERE id = ?", (1_700_000_099.5, cid))
    return cid


def test_json_round_trip_is_lossless(store: Store, tmp_path: Path) -> None:
    cid = build(store)
    first = conversation_to_json(store, cid)
    assert first["conversation"]["recallable"] is False
    assert first["messages"][1]["origins"] == "mccr" and first["messages"][1]["tokens"] == [504, 2368, 30, 7]
    assert first["copy_history"]["recall"] == {"accepted": 1.0, "tested": 2.0}
    comparison = first["comparisons"][0]
    assert (comparison["status"], comparison["copy_history"]) == ("cancelled", {"context": {"accepted": 3.0,
                                                                                            "tested": 4.0}})
    assert [(r["side"], r["repeat"], r["position"]) for r in comparison["runs"]] == [
        ("off", 0, 0), ("on", 0, 1), ("on", 1, 0), ("off", 1, 1)]
    assert comparison["runs"][1]["rates"][1] == {"round": 3, "source": "recall", "rate": 0.5}
    assert comparison["runs"][0]["rates"] is None and comparison["runs"][1]["origins"] == "mr"
    text = json.dumps(first)
    with Store.open(tmp_path / "other") as other:  # a fresh store, as on another machine
        new = import_conversation(other, json.loads(text), "t.json")
        assert conversation_to_json(other, new.id) == first
    again = import_conversation(store, json.loads(text), "t.json")  # and beside the original
    assert again.id != cid and again.updated_at == 1_700_000_099.5
    assert conversation_to_json(store, again.id) == first
    assert [m.content for m in store.messages(again.id)] == [m.content for m in store.messages(cid)]


def test_html_is_self_contained_and_escaped(store: Store) -> None:
    cid = build(store)
    page = conversation_to_html(store, cid)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "<script" not in page.lower()
    assert "out of memory &lt;b&gt;" in page
    assert "http://" not in page and "https://" not in page and "src=" not in page
    assert "prefers-color-scheme" in page and "pre-wrap" in page
    assert "Typos" in page and "copied 75%" in page and "context 3/4" in page
    assert ('<tr><th>off</th><td>40.0</td><td>cancelled</td><td>40.0</td><td>0.0%</td></tr>' in page
            and '<tr><th>on</th><td>46.0</td><td>47.0</td><td>46.5</td><td>2.2%</td></tr>' in page)
    assert "<li>all 3 complete runs token-equal</li>" in page
    assert "<li>off rows: context 3/4 accepted, 1 wasted</li>" in page


def test_markdown_has_roles_contents_and_marks(store: Store) -> None:
    cid = build(store)
    md = conversation_to_markdown(store, cid)
    assert md.startswith("# Typos\n")
    assert "## System prompt\n\nBe brief." in md
    assert "## User\n\nFix: teh cat <script>alert(1)</script>" in md  # verbatim in Markdown
    assert "## Assistant\n\nThe cat." in md
    assert "## Assistant (partial: stopped early)" in md and "## Assistant (error)" in md
    assert "**Error:** out of memory" in md
    assert "6 tokens · 12.0 tok/s" in md and "rows accepted/tested: context 3/4" in md
    assert "not offered to Recall" in md and "temperature=0.0" in md
    assert "## Comparison 1 (cancelled)" in md and "**Request:**\n\nFix: teh\n" in md
    assert ("| side | round 1 | round 2 | median | spread |\n|---|---|---|---|---|\n"
            "| off | 40.0 | cancelled | 40.0 | 0.0% |\n| on | 46.0 | 47.0 | 46.5 | 2.2% |\n") in md
    assert ("- on / off: 1.16x (median tok/s)\n- all 3 complete runs token-equal\n"
            "- off rows: context 3/4 accepted, 1 wasted\n- on rows: context 6/8 accepted, 2 wasted\n") in md


def test_comparison_reports_the_first_token_difference_and_errors(store: Store) -> None:
    conv = store.create_conversation(title="diff")
    store.add_comparison([{"role": "user", "content": "q"}], [
        ComparisonRun("plain", 0, 0, "ab", "complete", stats={"generated": 2, "seconds": 0.1}, tokens=(1, 2)),
        ComparisonRun("on", 0, 1, "ac", "complete", stats={"tokens_per_s": 30.0}, tokens=(1, 3)),
        ComparisonRun("on", 1, 0, "", "error", error="<oom> & out"),
    ], conversation_id=conv.id)
    md = conversation_to_markdown(store, conv.id)
    assert "| on | 30.0 | error | 30.0 | 0.0% |\n| plain | 20.0 | – | 20.0 | 0.0% |" in md  # 20.0: 2 tokens / 0.1 s
    assert "- tokens differ: on round 1 has 3 at token 1 where plain round 1 has 2\n" in md
    assert "- on round 2: error: <oom> & out" in md
    page = conversation_to_html(store, conv.id)
    assert "<li>on round 2: error: &lt;oom&gt; &amp; out</li>" in page and "<oom>" not in page


def _bad(doc: dict[str, Any], case: str) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    if case == "format":
        d["format"] = "something-else"
    elif case == "version":
        d["version"] = 99  # newer than this Lanes reads
    elif case == "role":
        d["messages"][1]["role"] = "robot"
    elif case == "origins":
        d["messages"][1]["origins"] = "mc"
    elif case == "token":
        d["messages"][3]["tokens"] = [1.5]
    elif case == "run status":
        d["comparisons"][0]["runs"][1]["status"] = "done"
    elif case == "side":
        d["comparisons"][0]["runs"][1]["side"] = "both"
    elif case == "repeat":
        d["comparisons"][0]["runs"][2]["repeat"] = -1
    elif case == "duplicate":
        d["comparisons"][0]["runs"][3]["side"] = "on"  # a second "on" in repeat 1
    elif case == "rate":
        d["comparisons"][0]["runs"][1]["rates"][1]["rate"] = "high"
    elif case == "rate round":
        del d["comparisons"][0]["runs"][2]["rates"][0]["round"]
    elif case == "comparison status":
        d["comparisons"][0]["status"] = "finished"
    return d


@pytest.mark.parametrize(("case", "field"), [
    ("format", "format"), ("version", "version"), ("role", "messages[1].role"),
    ("origins", "messages[1].origins"), ("token", "messages[3].tokens[0]"),
    ("run status", "comparisons[0].runs[1].status"), ("side", "comparisons[0].runs[1].side"),
    ("repeat", "comparisons[0].runs[2].repeat"), ("duplicate", "comparisons[0].runs[3]"),
    ("rate", "comparisons[0].runs[1].rates[1].rate"), ("rate round", "comparisons[0].runs[2].rates[0].round"),
    ("comparison status", "comparisons[0].status"),
])
def test_invalid_import_names_file_and_field_and_writes_nothing(store: Store, case: str, field: str) -> None:
    doc = conversation_to_json(store, build(store))
    before = store.count_conversations()
    with pytest.raises(TranscriptError) as err:
        import_conversation(store, _bad(doc, case), "bad.json")
    assert str(err.value).startswith(f"bad.json: {field} "), str(err.value)
    assert store.count_conversations() == before
    assert isinstance(err.value, LanesError)


def test_not_a_document(store: Store) -> None:
    with pytest.raises(TranscriptError, match=r"^x\.json: the document must be a JSON object"):
        import_conversation(store, [1, 2], "x.json")  # type: ignore[arg-type]
    with pytest.raises(TranscriptError, match=r"^x\.json: conversation is missing"):
        import_conversation(store, {"format": "lanes-conversation", "version": 1}, "x.json")
    assert store.count_conversations() == 0


# -- the command line, as a person runs it -----------------------------------------
def lanes(*argv: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "engine.cli", *map(str, argv)], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)


def test_cli_export_refuses_overwrite_then_forces(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as s:
        cid = build(s)
    out = tmp_path / "t.html"
    out.write_text("keep me")
    r = lanes("export", cid, "--format", "html", "-o", out, "--data-dir", data)
    assert r.returncode == 2 and str(out) in r.stderr and "--force" in r.stderr
    assert out.read_text() == "keep me"
    r = lanes("export", cid, "--format", "html", "-o", out, "--force", "--data-dir", data)
    assert r.returncode == 0, r.stderr
    assert "&lt;script&gt;" in out.read_text(encoding="utf-8")
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    r = lanes("export", 999, "--format", "md", "-o", tmp_path / "x.md", "--data-dir", data)
    assert r.returncode == 2 and "no conversation 999" in r.stderr and not (tmp_path / "x.md").exists()


def test_cli_export_all_then_import(tmp_path: Path) -> None:
    data, folder = tmp_path / "data", tmp_path / "all"
    with Store.open(data) as s:
        ids = [build(s), s.create_conversation(title="empty").id]
    r = lanes("export", "--all", "--format", "md", "-o", folder, "--data-dir", data)
    assert r.returncode == 2 and "--format json" in r.stderr and not folder.exists()
    r = lanes("export", "--all", "--format", "json", "-o", folder, "--data-dir", data)
    assert r.returncode == 0, r.stderr
    files = sorted(folder.iterdir())
    assert [f.name for f in files] == [f"conversation-{i}.json" for i in sorted(ids)]
    r = lanes("export", "--all", "--format", "json", "-o", folder, "--data-dir", data)
    assert r.returncode == 2 and "already exists (and 1 more)" in r.stderr

    fresh = tmp_path / "fresh"
    r = lanes("import", *files, "--data-dir", fresh)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [f"imported {files[0]} as conversation 1 (Typos)",
                                     f"imported {files[1]} as conversation 2 (empty)"]
    with Store.open(data) as s, Store.open(fresh) as f:
        assert conversation_to_json(f, 1) == conversation_to_json(s, ids[0])


def test_cli_import_errors_leave_nothing(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with Store.open(data) as s:
        good = conversation_to_json(s, build(s))
    good_file, bad_json, bad_doc = tmp_path / "good.json", tmp_path / "broken.json", tmp_path / "bad.json"
    good_file.write_text(json.dumps(good))
    bad_json.write_text('{"format": ')
    bad_doc.write_text(json.dumps(_bad(good, "role")))
    for files, expected in (
        ([good_file, bad_json], f"{bad_json} is not valid JSON (line 1"),
        ([good_file, bad_doc], f"{bad_doc}: messages[1].role must be one of"),
        ([good_file, tmp_path / "missing.json"], f"{tmp_path / 'missing.json'}: no such file"),
    ):
        r = lanes("import", *files, "--data-dir", data)
        assert r.returncode == 2 and expected in r.stderr, r.stderr
        assert r.stdout == ""
    with Store.open(data) as s:
        assert s.count_conversations() == 1
