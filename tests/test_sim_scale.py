"""docs/scale.md is what `make scale-page` prints (its rows, recomputed on fewer ranks), and
`make step-vs-measured`'s table is read from its runs' files."""

from __future__ import annotations

import json
import os

import pytest

from mpidp.sim import measured, scale
from mpidp.sim.profile import read
from mpidp.untrusted import InputError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROFILE = os.path.join(ROOT, "docs", "scale", "gpt-profile.json")


def sections(text: str) -> list[list[str]]:
    """Each rate's table rows, in the page's order."""
    return [[line for line in part.splitlines() if line.startswith("| ") and
             line[2].isdigit()] for part in text.split("\n## ")[1:]]


def test_the_page_holds_what_the_command_prints():
    with open(os.path.join(ROOT, "docs", "scale.md"), encoding="utf-8") as f:
        page = f.read()
    ranks = scale.RANKS[:5]  # 2 .. 32: each row depends on its own N alone
    printed = scale.page(read(PROFILE), ranks)
    assert printed.split("\n## ")[0] == page.split("\n## ")[0]  # the head: profile, network
    assert [rows[:len(ranks)] for rows in sections(page)] == sections(printed)
    assert all(len(rows) == len(scale.RANKS) for rows in sections(page))


def test_a_profile_of_another_gpt_is_refused(tmp_path, capsys):
    data = json.load(open(PROFILE))
    data["shape"] = [256, 64, 3, 4, 64]
    path = tmp_path / "other.json"
    path.write_text(json.dumps(data))
    assert scale.main([str(path)]) == 2
    assert "other.json" in capsys.readouterr().err


def test_step_vs_measured_reads_its_runs(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"modes": {
        "serial": {"step_ms": 10.0, "backward_ms": 4.0, "exposed_comm_ms": 3.0},
        "overlap": {"step_ms": 8.0, "backward_ms": 4.5, "exposed_comm_ms": 1.0}}}))
    steps = {}
    for mode, s, e in (("serial", 0.011, 0.004), ("overlap", 0.0072, 0.0005)):
        steps[mode] = str(tmp_path / f"{mode}.json")
        (tmp_path / f"{mode}.json").write_text(json.dumps({"rows": [{"step_s": s,
                                                                      "exposed_s": e}]}))
    got = measured.compare(str(bench), steps)
    assert [tuple(pytest.approx(x) if isinstance(x, float) else x for x in row) for row in got] \
        == [("serial", 10.0, 11.0, 4.0, 3.0, 4.0), ("overlap", 8.0, 7.2, 4.5, 1.0, 0.5)]
    bench.write_text(json.dumps({"modes": {"serial": {"step_ms": "fast"}}}))
    with pytest.raises(InputError, match="bench.json"):
        measured.compare(str(bench), steps)
    assert measured.gbit("200mbit") == 0.2 and measured.gbit("10gbit") == 10.0
