"""Tests for engine.bench.cell_specs: benchmark cells and the family settings a cell overrides (literal data)."""

from types import MappingProxyType

import pytest

from engine.bench.cell_specs import Cell, parse_cell, parse_cells
from engine.errors import LanesError
from engine.model.families import Family


def test_worked_example_from_docstring() -> None:
    cells = parse_cells("off,on,on:doubt_prior=0.6:max_window=16")
    assert [c.spec for c in cells] == ["off", "on", "on:doubt_prior=0.6:max_window=16"]
    assert [c.base for c in cells] == ["off", "on", "on"]
    assert dict(cells[2].settings) == {"doubt_prior": 0.6, "max_window": 16}
    fam = Family(name="smollm2", own_copy_rates=True)
    changed = cells[2].with_settings(fam)
    assert (changed.doubt_prior, changed.max_window) == (0.6, 16)
    assert (changed.name, changed.copy_rate, changed.own_copy_rates) == ("smollm2", 0.94, True)
    assert cells[1].with_settings(fam) is fam  # no settings: the family itself


def test_min_row_value_is_a_rate_the_allocator_gets_from_the_family() -> None:
    fam = Family(name="smollm2", own_copy_rates=True)
    assert parse_cell("on:min_row_value=0.15").with_settings(fam).min_row_value == 0.15
    assert fam.min_row_value == 0.3  # the allocator's MIN_ROW_VALUE unless a cell or family says otherwise
    with pytest.raises(LanesError, match="strictly between 0 and 1"):
        parse_cell("on:min_row_value=1.5")


def test_min_match_entry_changes_alone() -> None:
    fam = Family(name="f", min_match=MappingProxyType({"context": 4, "recall": 8}))
    changed = parse_cell("on:min_match.context=6").with_settings(fam)
    assert dict(changed.min_match) == {"context": 6, "recall": 8}
    assert dict(fam.min_match) == {"context": 4, "recall": 8}  # the registry's family is untouched


def test_brief_matches_can_be_turned_off() -> None:
    fam = Family(name="f", own_copy_rates=True)
    assert fam.brief_match == 2
    assert parse_cell("on:brief_match=0").with_settings(fam).brief_match == 0


def test_context_cost_is_the_engines_not_the_familys() -> None:
    fam = Family(name="f", own_copy_rates=True)
    flat, priced = parse_cell("on:context_cost=false:max_window=8"), parse_cell("on")
    assert (flat.context_cost, priced.context_cost) == (False, True)
    changed = flat.with_settings(fam)
    assert changed.max_window == 8 and not hasattr(changed, "context_cost")


def test_bases_say_what_runs() -> None:
    got = {c.base: (c.drafts, c.own_copy_rates) for c in parse_cells("mlx-lm,mlx-lm-batch,plain,off,on")}
    assert got == {"mlx-lm": (False, False), "mlx-lm-batch": (False, False), "plain": (False, False),
                   "off": (True, False), "on": (True, True)}


@pytest.mark.parametrize(("text", "value"), [("true", True), ("On", True), ("1", True), ("false", False),
                                             ("off", False), ("0", False)])
def test_boolean_settings(text: str, value: bool) -> None:
    assert parse_cell(f"off:copy_edits={text}").settings == {"copy_edits": value}


def test_spaces_around_cells_are_dropped_and_empty_entries_skipped() -> None:
    assert [c.spec for c in parse_cells(" off , on:copy_rate=0.9 ,,")] == ["off", "on:copy_rate=0.9"]
    assert parse_cells("off,on:copy_rate=0.9")[1] == Cell("on:copy_rate=0.9", "on", {"copy_rate": 0.9})


@pytest.mark.parametrize(("spec", "message"), [
    ("turbo", r"unknown cell 'turbo'; choose from mlx-lm, mlx-lm-batch, plain, off, on"),
    ("mlx-lm:max_window=4", r"only the Lanes cells \(plain, off, on\) take settings"),
    ("on:speed=2", r"'speed=2' is not a setting; write key=value with key one of copy_rate, doubt_prior"),
    ("on:doubt_prior", r"'doubt_prior' is not a setting"),
    ("on:doubt_prior=1.5", r"doubt_prior is a rate, strictly between 0 and 1, not 1.5"),
    ("on:copy_rate=0", r"copy_rate is a rate, strictly between 0 and 1, not 0"),
    ("on:copy_rate=high", r"copy_rate takes a number, not 'high'"),
    ("on:max_window=2.5", r"max_window takes an integer, not '2.5'"),
    ("on:max_window=0", r"max_window must be at least 1, not 0"),
    ("on:copy_edits=maybe", r"copy_edits takes true or false, not 'maybe'"),
    ("on:max_window=4:max_window=8", r"max_window is set twice"),
    ("on:brief_match=-1", r"brief_match must be at least 0, not -1"),
])
def test_bad_cells_name_the_cell_and_the_limit(spec: str, message: str) -> None:
    with pytest.raises(LanesError, match=message):
        parse_cell(spec)


def test_a_list_refuses_repeats_and_emptiness() -> None:
    with pytest.raises(LanesError, match=r"given twice: on:copy_rate=0.9"):
        parse_cells("on:copy_rate=0.9,off,on:copy_rate=0.9")
    with pytest.raises(LanesError, match="no cells given"):
        parse_cells(" , ")


def test_a_cell_may_run_the_generic_pass() -> None:
    cell = parse_cell("on:generic_pass=true")
    assert cell.generic_pass and not parse_cell("on").generic_pass
    family = Family(name="x")
    assert cell.with_settings(family) == family  # an engine setting, not a family one


def test_run_ahead_settings_are_the_engines_and_on_unless_turned_off() -> None:
    cell = parse_cell("on:continue_copies=false:start_copies=false:probe_starts=false")
    default = parse_cell("on")
    assert (cell.continue_copies, cell.start_copies, cell.probe_starts) == (False, False, False)
    assert (default.continue_copies, default.start_copies, default.probe_starts) == (True, True, True)
    family = Family(name="x")
    assert cell.with_settings(family) == family


def test_fused_attention_setting_picks_the_passes_attention(loaded) -> None:
    from dataclasses import replace

    from engine.bench.runner import cell_passes
    from engine.passes.choice import accelerator

    (cell,) = parse_cells("on:fused_attention=false")
    assert cell.with_settings(loaded.family) == loaded.family  # an engine setting, not the family's
    gpu = replace(loaded, passes=replace(accelerator(loaded.model, loaded.kinds), fused_attention=True))
    assert not cell_passes(gpu, cell).fused_attention
    assert cell_passes(gpu, parse_cells("on")[0]).fused_attention
    assert cell_passes(gpu, parse_cells("on:compiled=false")[0]).fused_attention
    assert cell_passes(gpu, parse_cells("on:compiled=false")[0]).compiled is None


def test_compile_alone_setting_picks_a_lone_stream_s_compilation(loaded) -> None:
    from dataclasses import replace

    from engine.bench.runner import cell_passes
    from engine.passes.choice import accelerator

    fused = replace(accelerator(loaded.model, loaded.kinds), fused_attention=True, compile_alone=True)
    gpu = replace(loaded, passes=fused)
    assert cell_passes(gpu, parse_cells("on")[0]).compile_alone
    assert not cell_passes(gpu, parse_cells("on:compile_alone=false")[0]).compile_alone
    assert not cell_passes(gpu, parse_cells("on:fused_attention=false")[0]).compile_alone  # masked: more kernels
    assert not cell_passes(gpu, parse_cells("on:compiled=false")[0]).compile_alone  # nothing compiled
    assert cell_passes(gpu, parse_cells("on")[0]).lanes(loaded.kinds).views  # the lanes build
    cpu = replace(loaded, passes=accelerator(loaded.model, loaded.kinds))
    assert cell_passes(cpu, parse_cells("on:compile_alone=true")[0]).compile_alone


def test_compile_drafts_setting_runs_drafting_rounds_as_planned(loaded) -> None:
    """``compile_drafts=false``: an accelerator's drafting rounds at their own width, uncompiled, under
    passes of another name, so that `lanes bench` calibrates its costs apart; by default they are
    padded to a multiple of 8 rows (``=true`` turns that back on for passes without it), and with
    nothing compiled nothing is padded."""
    from dataclasses import replace

    from engine.bench.runner import cell_passes
    from engine.passes.choice import accelerator

    gpu = replace(loaded, passes=accelerator(loaded.model, loaded.kinds))
    (cell,) = parse_cells("on:compile_drafts=false")
    assert cell.with_settings(loaded.family) == loaded.family  # an engine setting, not the family's
    assert cell_passes(gpu, parse_cells("on")[0]).draft_step == 8
    planned = cell_passes(gpu, cell)
    assert planned.draft_step == 1 and planned.compiled is not None and planned.name != gpu.passes.name
    assert cell_passes(gpu, parse_cells("on:compiled=false")[0]).draft_step == 1
    assert cell_passes(gpu, parse_cells("on:compile_drafts=true")[0]) is gpu.passes  # as chosen already
    again = cell_passes(replace(gpu, passes=planned), parse_cells("on:compile_drafts=true")[0])
    assert again.draft_step == 8 and again.name != planned.name
    assert cell_passes(loaded, cell) is loaded.passes  # the CPU's passes compile nothing


def test_round_costs_setting_calibrates_apart(loaded) -> None:
    """``round_costs=false``: an accelerator's cost model calibrated from bare passes, under passes of
    another name (so `lanes bench` and round_trace.py calibrate it apart); by default an accelerator's
    passes are timed as rounds run; the CPU's passes run nothing ahead, so the setting leaves them."""
    from dataclasses import replace

    from engine.bench.runner import cell_passes
    from engine.passes.choice import accelerator

    gpu = replace(loaded, passes=accelerator(loaded.model, loaded.kinds))
    (cell,) = parse_cells("on:round_costs=false")
    assert cell.with_settings(loaded.family) == loaded.family  # an engine setting, not the family's
    assert cell_passes(gpu, parse_cells("on")[0]).round_costs
    bare = cell_passes(gpu, cell)
    assert not bare.round_costs and bare.name != gpu.passes.name and bare.speculate_ahead
    assert cell_passes(gpu, parse_cells("on:round_costs=true")[0]) is gpu.passes
    assert cell_passes(loaded, cell) is loaded.passes
