"""The chaos tests' ledger must be able to fail: check its judgements."""

from __future__ import annotations

from pathlib import Path

from tests.ledger import Ledger


def _ledger(tmp_path: Path, *lines: str) -> Ledger:
    path = tmp_path / "ledger.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return Ledger.read(path)


def test_a_repeat_needs_a_kill_between_the_calls(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, "start k 1 10", "end k 1 11", "start k 2 20", "end k 2 21")
    assert ledger.calls("k") == 2 and ledger.effects("k") == 2
    assert ledger.unjustified_repeats({}) == ["k"]
    assert ledger.unjustified_repeats({1: [5.0]}) == ["k"]  # an earlier process with pid 1
    assert ledger.unjustified_repeats({1: [5.0, 25.0]}) == ["k"]  # killed too late
    assert ledger.unjustified_repeats({1: [5.0, 15.0]}) == []  # killed after its effect


def test_a_killed_call_lasts_until_its_kill(tmp_path: Path) -> None:
    ledger = _ledger(tmp_path, "start k 1 10", "start k 2 20", "end k 2 21")
    assert ledger.overlapping({}) == ["k"]  # not killed: still under way at 20
    assert ledger.overlapping({1: [25.0]}) == ["k"]  # killed only after the second began
    assert ledger.overlapping({1: [15.0]}) == []
    assert ledger.unfinished({1: [15.0]}) == {}
    assert ledger.unfinished({1: [5.0]}) == {"k": 1}


def test_overlap_with_a_long_earlier_call_and_keys_apart(tmp_path: Path) -> None:
    ledger = _ledger(
        tmp_path,
        "start k 1 10", "end k 1 30",
        "start k 2 12", "end k 2 13",
        "start k 3 20", "end k 3 21",
    )  # fmt: skip
    assert ledger.overlapping({}) == ["k"]
    assert _ledger(tmp_path, "start k 1 10", "end k 1 11", "start j 2 10").overlapping({}) == []
