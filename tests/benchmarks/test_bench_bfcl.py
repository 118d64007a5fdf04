"""BFCL-v4 adapter: our scoring agrees with BFCL's own checkers on ground truth and wrong answers."""

from __future__ import annotations

import copy

import pytest

pytest.importorskip("bfcl_eval", reason="BFCL tests need the bench extra: pip install --no-deps bfcl-eval==2026.3.23")

from envace.benchmarks import bfcl  # noqa: E402
from envace.benchmarks.base import BenchEpisode  # noqa: E402
from envace.core.types import ToolCall  # noqa: E402
from envace.core.jsonl import read_jsonl_dicts  # noqa: E402
from envace.experiments.bench_runner import ScriptedUser, run_scored_episodes  # noqa: E402

from .helpers import ReplayActor  # noqa: E402

ADAPTER = bfcl.BFCLAdapter()


def test_tool_schema_conversion() -> None:
    doc = {"name": "math.factorial", "description": "d", "parameters": {"type": "dict", "properties": {
        "x": {"type": "float", "description": "x"}, "o": {"type": "dict", "properties": {"k": {"type": "tuple",
                                                                                                "items": {"type": "integer"}}}}},
        "required": ["x"]}}
    spec = bfcl.to_tool_spec(doc)
    assert spec.name == "math_factorial"
    p = spec.function.parameters
    assert p["type"] == "object" and p["properties"]["x"]["type"] == "number"
    assert p["properties"]["o"]["type"] == "object"
    assert p["properties"]["o"]["properties"]["k"] == {"type": "array", "items": {"type": "integer"}}


def _direct_ast(item, calls) -> bool:
    """BFCL's own AST checker called directly on its decoded-output format."""
    checker = bfcl._ast_checker()
    out = [{c.name: c.arguments} for c in calls]
    r = checker.ast_checker(item.raw["entry"]["function"], out, item.raw["answer"]["ground_truth"],
                            bfcl._language(item.category), item.category, bfcl.MODEL_NAME)
    return bool(r["valid"])


def _wrong_value(calls: list[ToolCall]) -> list[ToolCall] | None:
    """The same calls with the first scalar argument value changed to one no answer allows."""
    for i, c in enumerate(calls):
        for k, v in c.arguments.items():
            if isinstance(v, bool):
                bad = not v
            elif isinstance(v, (int, float)):
                bad = v + 9973
            elif isinstance(v, str):
                bad = "zz_not_an_answer"
            else:
                continue
            return [*calls[:i], ToolCall(name=c.name, arguments={**c.arguments, k: bad}), *calls[i + 1:]]
    return None


@pytest.mark.parametrize("category", bfcl.NON_LIVE + bfcl.LIVE)
def test_ast_agrees_with_bfcl_checker(category: str) -> None:
    """Every AST category: the possible answer as our calls is valid for our scoring and for BFCL's
    checker called directly; a wrong function name, a wrong argument value and missing arguments
    are judged the same way by both (the first two invalid)."""
    items = ADAPTER.load(category, limit=4)
    assert len(items) == 4
    for item in items:
        (gt,) = bfcl.ground_truth_turns(item)[0]
        ours = ADAPTER.score(item, BenchEpisode(item_id=item.id, turns=[[gt]])).valid
        assert ours == _direct_ast(item, gt) is True, item.id
        wrong = [ToolCall(name=gt[0].name + "_x", arguments=gt[0].arguments), *gt[1:]]
        assert ADAPTER.score(item, BenchEpisode(item_id=item.id, turns=[[wrong]])).valid is _direct_ast(item, wrong) is False
        bad_value = _wrong_value(gt)
        if bad_value is not None:
            got = ADAPTER.score(item, BenchEpisode(item_id=item.id, turns=[[bad_value]]))
            assert got.valid is _direct_ast(item, bad_value) is False, (item.id, bad_value)
        missing = [ToolCall(name=c.name, arguments={}) for c in gt]
        assert ADAPTER.score(item, BenchEpisode(item_id=item.id, turns=[[missing]])).valid is _direct_ast(item, missing)


def test_irrelevance_and_relevance_rules() -> None:
    """BFCL's relevance runner: a response is a function call when it decodes to a non-empty call
    list; irrelevance entries want none, live_relevance entries want one."""
    from bfcl_eval.utils import is_empty_output

    for cat in ("irrelevance", "live_irrelevance"):
        for irr in ADAPTER.load(cat, limit=2):
            call = ToolCall(name=irr.task.tools[0].name, arguments={})
            assert is_empty_output([]) and not is_empty_output(bfcl.decoded_output([call]))
            assert ADAPTER.score(irr, BenchEpisode(item_id=irr.id, turns=[[[]]])).valid
            assert not ADAPTER.score(irr, BenchEpisode(item_id=irr.id, turns=[[[call]]])).valid
    rel = ADAPTER.load("live_relevance", limit=1)[0]
    call = ToolCall(name=rel.task.tools[0].name, arguments={})
    assert ADAPTER.score(rel, BenchEpisode(item_id=rel.id, turns=[[[call]]])).valid
    assert not ADAPTER.score(rel, BenchEpisode(item_id=rel.id, turns=[[[]]])).valid


@pytest.mark.parametrize("category", bfcl.MULTI_TURN)
def test_multi_turn_ground_truth_through_our_loop(category: str) -> None:
    """Ground truth replayed by an actor through our episode loop against BFCLWorld (the real
    source) is valid for BFCL's multi-turn checker; so is the same ground truth fed directly.
    Dropping the last turn's calls makes both invalid."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_checker import multi_turn_checker

    items = ADAPTER.load(category, limit=3)
    plans = {i.id: bfcl.ground_truth_turns(i) for i in items}
    results = run_scored_episodes(ADAPTER, items, ReplayActor(plans), None, ScriptedUser())
    for run, item in zip(results, items):
        episode, world = run.episode, run.state
        assert len(episode.turns) == len(item.raw["answer"]["ground_truth"])
        assert world.calls, "the real source executed the calls"
        assert ADAPTER.score(item, episode, world).valid, item.id
        direct = multi_turn_checker([[turn] if turn else [] for turn in item.raw["answer"]["ground_truth"]],
                                    item.raw["answer"]["ground_truth"], copy.deepcopy(item.raw["entry"]),
                                    category, f"direct_{item.id}")
        assert direct["valid"]
        broken = [list(t) for t in episode.turns]
        last = max(i for i, t in enumerate(broken) if any(t))
        broken[last] = [[]]
        bad = ADAPTER.score(item, BenchEpisode(item_id=item.id, turns=broken))
        gt = item.raw["answer"]["ground_truth"]
        direct_bad = multi_turn_checker([[t] if t and i != last else [] for i, t in enumerate(gt)], gt,
                                        copy.deepcopy(item.raw["entry"]), category, f"directbad_{item.id}")
        assert bad.valid is bool(direct_bad["valid"]) is False


def test_world_never_raises_and_logs_calls() -> None:
    item = ADAPTER.load("multi_turn_base", limit=1)[0]
    world = ADAPTER.make_world(item)
    assert world.call("no_such_tool", {})["error"]["code"] == "TOOL_NOT_AVAILABLE"
    assert world.call("cd", {"bogus": 1})["error"]["code"] == "EXECUTION_ERROR"
    assert "result" in world.call("pwd", {}) or world.calls[-1][1]
    assert len(world.calls) == 3


def test_overall_weights() -> None:
    acc = {c: 1.0 for c in bfcl.RUNNABLE}
    sizes = {c: 10 for c in bfcl.LIVE}
    out = bfcl.overall(acc, sizes)
    assert out["overall_runnable"] == pytest.approx(1.0)
    assert out["overall_leaderboard"] == pytest.approx(0.6)  # agentic (40%) not run


def test_bench_eval_writes_run_dir(tmp_path, tiny_backend) -> None:
    from envace.experiments.bench_job import BenchJob, run_bench_job

    job = BenchJob(bench="bfcl", categories=["multi_turn_base", "simple_python"], limit=2, max_steps=2,
                   max_new_tokens=8, out=str(tmp_path), name="r", model="tiny")
    run = run_bench_job(job, backend=tiny_backend)
    assert len(run.trajectories()) == 4
    assert (run.path / "scores.jsonl").read_text().count("\n") == 4
    text = (run.path / "summary.md").read_text()
    assert "acc/multi_turn_base" in text and "overall_runnable" in text
    assert "stop_reasons" in text


class _DiesAfter:
    """The tiny backend, interrupted (as by Ctrl-C) at its ``n``-th generate call."""

    def __init__(self, backend, n: int) -> None:
        self._backend, self._left = backend, n

    def __getattr__(self, name):
        return getattr(self._backend, name)

    def generate(self, prompts, params):
        self._left -= 1
        if self._left < 0:
            raise KeyboardInterrupt
        return self._backend.generate(prompts, params)


def test_bench_eval_writes_each_chunk_as_it_is_scored(tmp_path, tiny_backend) -> None:
    from envace.experiments.bench_job import BenchJob, run_bench_job

    def job(name, chunk):
        return BenchJob(bench="bfcl", categories=["simple_python"], limit=3, max_new_tokens=8, out=str(tmp_path),
                        name=name, model="tiny", chunk=chunk)

    whole = run_bench_job(job("whole", None), backend=tiny_backend)
    chunked = run_bench_job(job("chunked", 1), backend=tiny_backend)
    rows = lambda run: [(r["item_id"], r["valid"]) for r in read_jsonl_dicts(run.path / "scores.jsonl")]  # noqa: E731
    assert rows(chunked) == rows(whole) and len(rows(whole)) == 3
    # simple_python is one caller turn per entry: one generate call per chunk of 1. Interrupted in
    # the third chunk, the first two are on disk.
    with pytest.raises(KeyboardInterrupt):
        run_bench_job(job("killed", 1), backend=_DiesAfter(tiny_backend, 2))
    killed = tmp_path / "killed"
    assert [r["item_id"] for r in read_jsonl_dicts(killed / "scores.jsonl")] == [i for i, _ in rows(whole)[:2]]
    assert len(read_jsonl_dicts(killed / "trajectories.jsonl")) == 2
