"""``envace bench list``: every benchmark with its categories, counts, needs and what does not run."""

from __future__ import annotations

import json

from envace.cli.main import main


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


def test_bench_eval_unknown_category_is_a_clean_error(capsys) -> None:
    assert main(["bench", "eval", "--bench", "vitabench", "--category", "ota", "--model", "tiny"]) == 2
    assert "not available here" in capsys.readouterr().err
