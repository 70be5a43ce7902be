"""The report's text, from hand-made statistics (no runtime needed)."""

from __future__ import annotations

from adaptive_eager.reporting import ADVICE, advice_for, format_report, problem_sites, write_report
from adaptive_eager.statistics import Stats

SITE = __file__ + ":12 (train)"


def _stats(**kw):
    base = dict(
        ops_captured=1200, ops_fused=900, ops_eager=300, windows=40, regions_compiled=3,
        compiled_calls=37, cache_hits=37, cache_misses=3, compile_time_s=2.5,
        flushes={"item": 30, "exit": 1, "window_full": 9},
        sync_sites={SITE: 30, "loop.py:40 (main)": 9, "loop.py:50 (main)": 1},
        sync_site_reasons={SITE: {"item": 30}, "loop.py:40 (main)": {"window_full": 9},
                           "loop.py:50 (main)": {"exit": 1}},
        fallback_ops={"aten::nonzero": 5, "aten::_local_scalar_dense": 30},
        fallback_reasons={"aten::nonzero": ("data_dependent",),
                          "aten::_local_scalar_dense": ("data_dependent",)},
    )
    base.update(kw)
    return Stats(**base)


def test_headline_numbers():
    text = format_report(_stats())
    assert "1,200" in text and "75% fused" in text and "hit rate 92%" in text
    assert "2.50 s" in text and "regions compiled   3" in text


def test_routine_sites_are_not_advised():
    sites = problem_sites(_stats())
    assert [s[0] for s in sites] == [SITE]


def test_sync_site_shows_code_and_advice():
    text = format_report(_stats())
    assert "from __future__ import annotations" not in text
    assert SITE in text
    assert ADVICE["item"].split(":")[0] in text


def test_item_is_not_listed_as_a_fallback():
    text = format_report(_stats())
    fallbacks = text.split("Fallback ops")[1]
    assert "aten::nonzero" in fallbacks and "_local_scalar_dense" not in fallbacks


def test_unknown_reasons_fall_back_to_source_hints():
    s = _stats(sync_site_reasons={})
    assert problem_sites(s)  # reasons guessed from the source line, or "sync"


def test_advice_covers_observe_reasons():
    assert advice_for("observe:repr") == ADVICE["repr"]
    assert advice_for("observe:__array__") or advice_for("observe:array")
    assert advice_for("no_such_reason") == ""


def test_empty_stats():
    text = format_report(Stats())
    assert "none" in text and "hit rate -" in text


def test_write_report(tmp_path, capsys):
    write_report("hello\n", "stderr")
    write_report("to out\n", "stdout")
    write_report("file\n", str(tmp_path / "r.txt"))
    write_report("nothing\n", "0")
    out, err = capsys.readouterr()
    assert err == "hello\n" and out == "to out\n"
    assert (tmp_path / "r.txt").read_text() == "file\n"
    write_report("x", str(tmp_path / "missing" / "dir" / "r.txt"))  # logged, not raised


def test_fallback_advice_uses_fallback_meanings():
    s = _stats(fallback_ops={"aten::bernoulli_": 2, "region": 1, "aten::mul_": 3},
               fallback_reasons={"aten::bernoulli_": ("random",), "region": ("compile failed",),
                                 "aten::mul_": ("aliased_inputs",)})
    text = " ".join(format_report(s).split("Fallback ops")[1].split())  # undo wrapping
    assert "exact numbers); nothing to change" in text   # random ops are eager on purpose
    assert "runs eagerly from now on" in text            # a failed region
    assert "views of one tensor" in text
