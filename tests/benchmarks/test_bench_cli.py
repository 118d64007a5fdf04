"""``envace bench list``: every benchmark with its categories, counts, needs and what does not run."""

from __future__ import annotations

import json

import pytest

from envace.cli.main import main


def _vita_available() -> bool:
    from envace.benchmarks.vitabench import VitaBenchAdapter

    return VitaBenchAdapter().available()[0]


# The per-domain refusals below come after the data check: with no task files at all the message is
# that the benchmark is missing.
needs_vita = pytest.mark.skipif(not _vita_available(), reason="VitaBench task files not at <repo>/../shared/data")


def test_bench_list_json(capsys) -> None:
    assert main(["bench", "list", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"bfcl", "tau2", "vitabench", "finmcp"}
    for r in rows.values():
        assert r["needs"] and r["categories"]
        for c in r["categories"]:
            assert c["runnable"] or c["reason"], (r["name"], c["name"])
    vita = {c["name"]: c for c in rows["vitabench"]["categories"]}
    assert not vita["ota"]["runnable"] and "not available here" in vita["ota"]["reason"]


def test_bench_list_table(capsys) -> None:
    assert main(["bench", "list"]) == 0
    out = capsys.readouterr().out
    assert "bfcl" in out and "finmcp" in out


@needs_vita
def test_bench_eval_unknown_category_is_a_clean_error(capsys) -> None:
    assert main(["bench", "eval", "--bench", "vitabench", "--category", "ota", "--model", "tiny"]) == 2
    assert "not available here" in capsys.readouterr().err


@needs_vita
def test_eval_bench_clear_errors(capsys) -> None:
    """``envace eval --bench``: what cannot run here is refused in one line before any model loads."""
    assert main(["eval", "--bench", "vitabench", "--domain", "ota", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "not runnable here" in err and "ota" in err
    assert main(["eval", "--bench", "bfcl", "--category", "web_search_base", "--model", "tiny"]) == 2
    assert "live web search" in capsys.readouterr().err
    assert main(["eval", "--bench", "nope", "--model", "tiny"]) == 2
    assert "unknown benchmark" in capsys.readouterr().err
    assert main(["eval", "--bench", "vitabench", "--sweep", "--model", "tiny"]) == 2
    assert "cannot be combined with --bench" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_bench_runs_vitabench(tmp_path) -> None:
    """``envace eval --bench vitabench`` end to end with the tiny model as caller, user and judge
    (~10-30 s on 2 cores: the simulated user's and the judge's prompts are long)."""
    if not _vita_available():
        pytest.skip("VitaBench task files not at <repo>/../shared/data")
    assert main(["eval", "--bench", "vitabench", "--domain", "delivery", "--limit", "1", "--model", "tiny",
                 "--max-new-tokens", "4", "--max-steps", "1", "--max-user-turns", "1", "--out", str(tmp_path),
                 "--name", "v"]) == 0
    scores = [json.loads(line) for line in (tmp_path / "v" / "scores.jsonl").read_text().splitlines()]
    assert len(scores) == 1 and scores[0]["category"] == "delivery" and scores[0]["valid"] is False
    assert "acc/delivery" in (tmp_path / "v" / "summary.md").read_text()



def test_eval_bench_with_private_rehearsal_calls_no_real_tool(tmp_path) -> None:
    """``envace eval --bench bfcl --rehearse parallel --budget 2``: each entry is rehearsed twice
    (the policy writes every tool response, the scripted user turns play out), then committed once
    against BFCL's real environment."""
    assert main(["eval", "--bench", "bfcl", "--category", "multi_turn_base", "--limit", "2", "--model", "tiny",
                 "--max-new-tokens", "8", "--max-steps", "2", "--rehearse", "parallel", "--budget", "2",
                 "--out", str(tmp_path), "--name", "r"]) == 0
    rehearsals = [json.loads(line) for line in (tmp_path / "r" / "rehearsals.jsonl").read_text().splitlines()]
    assert len(rehearsals) == 4 and {r["attempt"] for r in rehearsals} == {0, 1}
    for r in rehearsals:
        tools = [m for m in r["trajectory"]["messages"] if m["role"] == "tool"]
        assert all(m.get("rehearsed") or "error" in m["content"] for m in tools)  # imagined or a format error
        assert sum(m["role"] == "user" for m in r["trajectory"]["messages"]) >= 1
    scores = (tmp_path / "r" / "scores.jsonl").read_text().splitlines()
    assert len(scores) == 2


def test_eval_bench_rehearsal_takes_a_plan_memory_and_refuses_the_model_written_one(tmp_path, capsys) -> None:
    from envace.cli.bench_cmd import job_from_args
    from envace.cli.main import build_parser

    args = build_parser().parse_args(["eval", "--bench", "bfcl", "--model", "tiny", "--rehearse", "parallel",
                                      "--memory", "plan"])
    assert job_from_args(args).memory == "plan"
    args = build_parser().parse_args(["eval", "--bench", "bfcl", "--model", "tiny"])
    assert job_from_args(args).memory == "rule"  # no --memory: the rule-based one
    assert main(["eval", "--bench", "bfcl", "--category", "multi_turn_base", "--limit", "1", "--model", "tiny",
                 "--rehearse", "parallel", "--budget", "1", "--memory", "model", "--out", str(tmp_path)]) == 2
    assert "--memory with --bench: rule or plan, not 'model'" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())  # refused before a run directory was made
