"""tools/hooks_bench.py (`make hooks-bench`) without the cluster: its commands, its reading
of the trainer's metrics, its medians and table. (A run across emulated hosts needs root:
it was tried by hand, see the report of issue 37.)"""

from __future__ import annotations

import json

import pytest

from mpidp.untrusted import InputError
from tools import hooks_bench as hb


def test_each_run_is_the_gpt_trainer_on_two_emulated_hosts():
    args = hb.parser().parse_args(["--steps", "7", "--", "--layers", "1", "--corpus-mb", "1"])
    cmd = hb.command(args, "100mbit", "powersgd:4", "m.jsonl")
    at = cmd.index("--")
    assert cmd[1:at] == ["-m", "mpidp.cluster", "run", "--hosts", "2", "--rate", "100mbit",
                         "--timeout", "1800"]
    trainer = cmd[at + 1:]
    assert trainer[1].endswith("examples/train_gpt.py")
    for flag, value in (("--max-steps", "7"), ("--eval-every", "7"), ("--comm-hook",
                                                                       "powersgd:4")):
        assert trainer[trainer.index(flag) + 1] == value
    assert trainer[-4:] == ["--layers", "1", "--corpus-mb", "1"]
    assert hb.shared(args.trainer) == ["--layers", "1"]  # sim step has no --corpus-mb


@pytest.mark.parametrize("rate, gbit", [("100mbit", 0.1), ("1gbit", 1.0), ("2.5gbit", 2.5),
                                        ("500kbit", 5e-4)])
def test_tc_rates_in_gbit(rate, gbit):
    assert hb.gbit(rate) == pytest.approx(gbit)


def test_the_last_metrics_row_gives_step_time_and_loss(tmp_path):
    path = tmp_path / "m.jsonl"
    rows = [{"step": 0, "val_loss": 4.4, "tokens_per_s": 0.0},
            {"step": 60, "val_loss": 3.1, "tokens_per_s": 3072.0, "loss": 3.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert hb.last_row(str(path), 24 * 64) == {"step": 60, "step_ms": 500.0, "val_loss": 3.1}
    path.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(InputError, match="tokens_per_s"):
        hb.last_row(str(path), 24 * 64)
    path.write_text('{"step": "x"}\n')
    with pytest.raises(InputError, match="m.jsonl"):
        hb.last_row(str(path), 24 * 64)


def test_the_table_has_medians_and_each_hook_against_none():
    runs = [{"rate": "1gbit", "hook": h, "run": k, "step_ms": ms, "val_loss": loss}
            for h, k, ms, loss in [("none", 1, 100, 3.0), ("none", 2, 130, 3.6),
                                   ("none", 3, 110, 3.1), ("fp16", 1, 60, 3.3),
                                   ("fp16", 2, 50, 3.1), ("fp16", 3, 55, 3.9)]]
    lines = hb.table(runs, {("1gbit", "none"): 105.0, ("1gbit", "fp16"): 52.0}).splitlines()
    assert lines[2] == "| 1gbit | none | 110.0 | 1.00x | 3.1000 | 3 | 105.0 |"
    assert lines[3] == "| 1gbit | fp16 | 55.0 | 0.50x | 3.3000 | 3 | 52.0 |"  # not means
