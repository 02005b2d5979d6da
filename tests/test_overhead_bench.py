"""benchmarks/overhead.py: what its JSON says of a comparison (no servers started here)."""
from __future__ import annotations

import subprocess

import pytest

from benchmarks.overhead import paired_ratios, tree_state, verdict


def row(n: int, side: str, cpu: float) -> dict:
    return {"round": n, "side": side, "server_cpu_ms_per_request": cpu, "qps": 100.0}


def test_the_ratio_to_main_is_taken_round_by_round():
    rows = [row(0, "this-1w", 1.8), row(0, "main", 2.0), row(1, "main", 3.0), row(1, "this-1w", 2.7),
            row(2, "this-1w", 2.2)]  # round 2 has no main block: no ratio for it
    assert paired_ratios(rows, "this-1w", "main") == [0.9, 0.9]
    summary = {"this-1w": {"server_cpu_ms_median": 2.2, "qps_pooled": 1.0},
               "main": {"server_cpu_ms_median": 2.5, "qps_pooled": 1.0}}
    got = verdict({"zero_cost": {"rows": rows, "summary": summary}})
    assert got["zero_cost_cpu_ratio_vs_main_by_round"] == [0.9, 0.9]
    assert got["zero_cost_cpu_ratio_vs_main_median"] == 0.9
    assert "zero_cost_cpu_ratio_vs_main_median" not in verdict({"zero_cost": {"rows": rows, "summary": {
        "this-1w": summary["this-1w"]}}})


def test_a_tree_with_uncommitted_changes_says_which(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "a.py").write_text("x = 1\n")
    git("add", "a.py")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    commit, changed = tree_state(tmp_path)
    assert len(commit) == 40 and changed == []
    (tmp_path / "a.py").write_text("x = 2\n")
    (tmp_path / "new.py").write_text("")  # untracked: not the measured tree's business
    assert tree_state(tmp_path) == (commit, ["a.py"])


def test_a_variant_is_one_more_single_worker_side_with_its_own_settings():
    from benchmarks.overhead import parse_args, sides_of

    args = parse_args(["--variant", "serial:TOKENIZERS_PARALLELISM=false,SIEVE_BATCH_MAX_WAIT_MS=2"])
    sides = {side.name: side for side in sides_of("zero_cost", args)}
    serial = sides["this-1w-serial"]
    assert serial.workers == 1 and serial.zero_cost
    assert serial.env == {"TOKENIZERS_PARALLELISM": "false", "SIEVE_BATCH_MAX_WAIT_MS": "2"}
    assert sides["this-1w"].env == {} and "this-2w-serial" not in sides
    both = {side.name: side for side in sides_of("zero_cost", parse_args(["--variant", "fp32:A=1", "--variant-2w"]))}
    assert (both["this-1w-fp32"].workers, both["this-2w-fp32"].workers) == (1, 2)
    assert both["this-2w-fp32"].env == {"A": "1"} and both["this-2w"].env == {}
    for wrong in ("serial", "serial:", "serial:TOKENIZERS_PARALLELISM", ":A=1"):
        with pytest.raises(SystemExit):
            parse_args(["--variant", wrong])


def test_main_at_two_workers_is_a_side_of_its_own_only_when_asked(tmp_path):
    from benchmarks.overhead import parse_args, sides_of

    asked = {side.name: side for side in sides_of("zero_cost", parse_args(["--baseline-tree", str(tmp_path),
                                                                           "--baseline-2w"]))}
    assert (asked["main-2w"].workers, asked["main-2w"].zero_cost, asked["main"].workers) == (2, True, 1)
    assert asked["main-2w"].tree == tmp_path.resolve()
    assert "main-2w" not in {side.name for side in sides_of("zero_cost", parse_args(["--baseline-tree", str(tmp_path)]))}
    summary = {side: {"server_cpu_ms_median": 1.0, "qps_pooled": qps}
               for side, qps in (("this-1w", 100.0), ("this-2w", 150.0), ("main", 100.0), ("main-2w", 180.0))}
    got = verdict({"zero_cost": {"rows": [], "summary": summary}})
    assert got["qps_ratio main-2w / main"] == 1.8 and got["qps_ratio this-2w / main-2w"] == 0.83
