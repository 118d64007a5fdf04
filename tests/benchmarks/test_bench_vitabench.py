"""VitaBench adapter: our tools over each task's state, the state check, the rubric judge."""

from __future__ import annotations

import pytest

from envace.benchmarks import vitabench as vb
from envace.benchmarks.base import BenchEpisode
from envace.core.types import Message
from envace.core.sampling import Generation

ADAPTER = vb.VitaBenchAdapter()
pytestmark = pytest.mark.skipif(not ADAPTER.available()[0], reason="VitaBench task files not at <repo>/../shared/data")


def test_tools_answer_and_never_raise() -> None:
    item = ADAPTER.load("delivery", limit=1)[0]
    w = ADAPTER.make_world(item)
    stores = w.call("search_stores", {"keyword": ""})["stores"]
    assert stores
    prods = w.call("get_store_products", {"store_id": stores[0]["id"]})["products"]
    assert prods
    assert w.call("get_store_products", {"store_id": "nope"})["error"]["code"] == "NOT_FOUND"
    assert w.call("create_delivery_order", {"store_id": 3})["error"]["code"] == "INVALID_PARAMETERS"
    assert w.call("fly", {})["error"]["code"] == "TOOL_NOT_AVAILABLE"


@pytest.mark.parametrize("domain,task_id", [("delivery", "10711001"), ("instore", "10826004")])
def test_gold_run_passes_state_check_and_empty_run_fails(domain: str, task_id: str) -> None:
    item = next(i for i in ADAPTER.load(domain) if i.raw["task"]["id"] == task_id)
    episode = BenchEpisode(item_id=item.id, messages=[Message(role="user", content="hi")])
    assert ADAPTER.score(item, episode, vb.gold_world(item)).valid
    assert not ADAPTER.score(item, episode, ADAPTER.make_world(item)).valid


class _FakeTok:
    def apply_chat_template(self, chat, tokenize=False, add_generation_prompt=True):
        return chat[-1]["content"]

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [1, 2, 3]}


class _Says:
    tokenizer = _FakeTok()

    def __init__(self, word: str) -> None:
        self.word = word

    def generate(self, prompts, params):
        return [Generation(token_ids=[1], logprobs=[0.0], text=self.word, finish="stop") for _ in prompts]


def test_rubric_judge_decides() -> None:
    item = next(i for i in ADAPTER.load("delivery") if i.raw["task"]["id"] == "10711001")
    episode = BenchEpisode(item_id=item.id, messages=[Message(role="user", content="hi")])
    ADAPTER.set_judge(_Says("YES, fine"))
    assert ADAPTER.score(item, episode, vb.gold_world(item)).valid
    ADAPTER.set_judge(_Says("NO"))
    s = ADAPTER.score(item, episode, vb.gold_world(item))
    assert not s.valid and s.detail["state_ok"] and s.detail["rubric_ok"] is False
    ADAPTER.judge = None


@pytest.mark.slow  # every task's environment is copied twice: ~10-30 s
@pytest.mark.parametrize("domain,at_least", [("delivery", 90), ("instore", 80)])
def test_state_check_coverage_over_every_task(domain: str, at_least: int) -> None:
    """Driving our tools to each task's first expected state passes our state check on most tasks
    (the rest need operations we do not implement, e.g. order edits, or name products a store does
    not sell); doing nothing passes on none. Measured: delivery 91/100, instore 83/100."""
    items = ADAPTER.load(domain)
    assert len(items) == 100
    episode = lambda i: BenchEpisode(item_id=i.id, messages=[Message(role="user", content="hi")])  # noqa: E731
    gold = sum(ADAPTER.score(i, episode(i), vb.gold_world(i)).detail["state_ok"] for i in items)
    empty = sum(ADAPTER.score(i, episode(i), ADAPTER.make_world(i)).detail["state_ok"] for i in items)
    assert gold >= at_least and empty == 0, (gold, empty)
