import json

import pytest

from envace.rollout.actors import OracleActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource
from envace.testtime import (
    cases_from_trajectories,
    compare_responses,
    error_probe_cases,
    important_fields,
    key_matters,
    measure_fidelity,
    same_structure,
    summarize_fidelity,
)

from testtime_helpers import ReplayWorldModel, few_tasks

REAL = {"order_id": "o-17", "status": "cancelled", "refund": {"amount": "42.50", "method": "card"},
        "items": [{"product_id": "p-1", "quantity": 1}, {"product_id": "p-2", "quantity": 3}]}


def cmp(real, rehearsed, ok=True):
    return compare_responses(real, json.dumps(rehearsed) if not isinstance(rehearsed, str) else rehearsed, ok)


def test_exact_match():
    m = cmp(REAL, REAL)
    assert m.format_ok and m.exact and m.structure and m.value and m.error_agree
    assert m.fields_total == m.fields_matched == 5  # order_id, status, refund.amount, 2 x product_id
    assert m.code_match is None


def test_same_structure_other_values():
    other = json.loads(json.dumps(REAL))
    other["order_id"] = "o-99"
    other["refund"]["method"] = "cash"  # not a field that matters
    m = cmp(REAL, other)
    assert m.structure and not m.exact and not m.value
    assert m.fields_matched == 4 and m.fields_total == 5


def test_values_that_matter_match_while_other_fields_differ():
    other = json.loads(json.dumps(REAL))
    other["refund"]["method"] = "cash"
    other["refund"]["amount"] = 42.5  # "42.50" and 42.5 are the same amount
    other["items"].reverse()  # order of list items does not matter for values
    m = cmp(REAL, other)
    assert m.value and m.structure and not m.exact


def test_structure_mismatch_and_invented_items():
    m = cmp(REAL, {"order_id": "o-17", "status": "cancelled"})
    assert not m.structure and not m.value and m.fields_matched == 2
    extra = json.loads(json.dumps(REAL))
    extra["items"].append({"product_id": "p-3", "quantity": 1})
    m = cmp(REAL, extra)
    assert m.structure and not m.value  # an invented extra item is a value error
    assert same_structure({"a": []}, {"a": [{"x": 1}]}) and not same_structure({"a": 1}, {"a": {"x": 1}})
    assert not same_structure([{"a": 1}], [{"a": 1}, {"b": 2}])


def test_error_agreement():
    err = {"error": {"code": "NOT_FOUND", "message": "no order o-1"}}
    m = cmp(err, {"error": {"code": "NOT_FOUND", "message": "Order not found"}})
    assert m.real_error and m.rehearsed_error and m.error_agree and m.code_match and m.structure and not m.exact
    assert m.value is None  # an error has no field that matters
    m = cmp(err, {"error": {"code": "INVALID_PARAMETERS", "message": "x"}})
    assert m.error_agree and m.code_match is False
    m = cmp(err, REAL)
    assert not m.error_agree and m.real_error and not m.rehearsed_error
    m = cmp(REAL, err)
    assert not m.error_agree and not m.value and m.fields_matched == 0


def test_right_json_in_broken_tags_is_measured_apart_from_the_format():
    text = "<output>\n" + json.dumps(REAL) + "\n</output> and more"
    m = compare_responses(REAL, text, format_ok=False)
    assert not m.format_ok and m.parsed and m.exact and m.value
    strict = compare_responses(REAL, text, format_ok=False, lenient=False)
    assert not strict.parsed and not strict.exact and not strict.structure
    cut = compare_responses(REAL, '<output>{"order_id": "o-17", "items": [{"product_id"', format_ok=False)
    assert not cut.parsed  # a truncated object is not read as one of its parts


def test_unparsable_rehearsal_and_booleans():
    m = cmp(REAL, "{not json", ok=False)
    assert not m.format_ok and not m.parsed and not m.exact and not m.structure and m.value is False
    assert not m.error_agree
    assert not cmp({"in_stock": True}, {"in_stock": 1}).exact
    assert cmp({"n": 1}, {"n": 1.0}).exact


def test_the_fields_rule():
    assert all(key_matters(k) for k in ("id", "order_id", "unit_price", "line_total", "subtotal", "balance",
                                        "to_balance_after", "refund", "item_count", "count", "status", "amount"))
    assert not any(key_matters(k) for k in ("name", "paid", "valid", "date", "quantity", "currency", "title"))
    f = important_fields({"results": [{"product_id": "p-1", "price": "9.90", "name": "x"}]})
    assert f == {("results.product_id", ("str", "p-1")): 1, ("results.price", ("num", 9.9)): 1}


@pytest.fixture(scope="module")
def oracle():
    tasks = [t for w in ("shop", "calendar", "bank") for t in few_tasks(w, 2)]
    trajs, _ = run_episodes(tasks, OracleActor(), RealSource(), RolloutConfig(max_turns=8))
    return tasks, trajs


def test_a_perfect_world_model_scores_one(oracle):
    tasks, trajs = oracle
    cases = cases_from_trajectories(tasks, trajs, "oracle") + error_probe_cases(tasks, trajs)
    assert sum(c.origin == "oracle" for c in cases) == sum(len(t.reference.calls) for t in tasks)
    probes = [c for c in cases if c.origin == "probe"]
    assert probes and all("error" in json.loads(c.real_text) for c in probes)
    pairs = measure_fidelity(tasks, cases, ReplayWorldModel())
    assert all(p.match.exact and p.match.error_agree for p in pairs)
    rows = summarize_fidelity(pairs, ("origin", "world"))
    assert {(r["origin"], r["world"]) for r in rows} >= {("oracle", "shop"), ("oracle", "bank"), ("probe", "shop")}
    assert all(r["exact"] == 1.0 and r["structure"] == 1.0 for r in rows)


def test_tiny_model_fidelity_end_to_end(tiny_backend, oracle):
    tasks, trajs = oracle
    cases = cases_from_trajectories(tasks, trajs, "oracle")
    # the history each case carries is the real one: earlier calls and their real results
    first, second = [c for c in cases if c.task_id == tasks[0].id][:2]
    assert first.earlier == [] and second.earlier == [(first.call, first.real_text)]
    source = ModelSource(tiny_backend, record_samples=False, max_new_tokens=8, temperature=0.0,
                         examples_as_recorded=False)  # the model alone
    pairs = measure_fidelity(tasks, cases, source)
    assert len(pairs) == len(cases) and all(p.gen_tokens > 0 for p in pairs)
    again = measure_fidelity(tasks, cases, source)
    assert [p.rehearsed for p in pairs] == [p.rehearsed for p in again]  # greedy: reproducible
    rows = summarize_fidelity(pairs, ("world", "tool"))
    assert sum(r["n"] for r in rows) == len(pairs)
    for r in rows:
        for k in ("format_ok", "exact", "structure", "error_agree"):
            assert 0.0 <= r[k] <= 1.0
    # rows survive a JSON round trip (the report reads them back)
    assert summarize_fidelity([json.loads(p.model_dump_json()) for p in pairs], ("world", "tool")) == rows


def test_fidelity_needs_real_trajectories(oracle):
    tasks, trajs = oracle
    fake = trajs[0].model_copy(update={"source": "rehearsal"})
    with pytest.raises(ValueError, match="real trajectories"):
        cases_from_trajectories(tasks, [fake], "oracle")


def test_recorded_calls_answered_as_recorded_and_the_examples_measured(tiny_backend, oracle):
    """With examples_as_recorded (the default) the oracle's calls that a task's examples record
    are answered from the record, not generated; each such pair says whether the record equals
    what the real world returned. Example cases rehearse the recorded calls with the record off."""
    from envace.rollout.sources import example_for
    from envace.testtime.fidelity import example_cases

    tasks, trajs = oracle
    cases = cases_from_trajectories(tasks, trajs, "oracle")
    by_id = {t.id: t for t in tasks}
    recorded = [c for c in cases if example_for(by_id[c.task_id], c.call) is not None]
    assert recorded, "covering grounding records some reference read calls"
    pairs = measure_fidelity(tasks, cases, ModelSource(tiny_backend, record_samples=False, max_new_tokens=8,
                                                       temperature=0.0))
    for c, p in zip(cases, pairs):
        mine = example_for(by_id[c.task_id], c.call)
        assert p.as_recorded == (mine is not None) and (p.gen_tokens == 0) == (mine is not None)
        if mine is not None:  # the real world answered these from the same initial state
            assert p.recorded_exact is not None and p.match.exact == p.recorded_exact
            assert json.loads(p.rehearsed) == mine.result
        else:
            assert p.recorded_exact is None
    (row,) = summarize_fidelity(pairs, ("origin",))
    assert row["as_recorded"] == pytest.approx(len(recorded) / len(cases)) and row["recorded_n"] == len(recorded)
    ex_cases = example_cases(tasks)
    assert len(ex_cases) == sum(len(t.examples) for t in tasks) and all(c.origin == "example" for c in ex_cases)
    ex_pairs = measure_fidelity(tasks, ex_cases, ModelSource(tiny_backend, record_samples=False, max_new_tokens=8,
                                                             temperature=0.0, examples_as_recorded=False))
    assert all(p.gen_tokens > 0 and not p.as_recorded for p in ex_pairs)
    assert measure_fidelity(tasks, ex_cases, ReplayWorldModel())[0].match.exact  # the record is the initial state
