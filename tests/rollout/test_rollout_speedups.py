"""The rollout engine's results do not depend on the generation speed-ups of issue #6: the same
episodes (greedy, and seeded sampling) with shared-prefix prefill on and off, rehearsal source."""

from __future__ import annotations

import pytest
import torch

from envace.core.prompts import PromptStyle
from envace.core.toolcall import format_tool_call
from envace.envs.tasks import load_tasks
from envace.policy.transformers_backend import TransformersBackend
from envace.rollout.actors import PolicyActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource


class CallingActor:
    """The policy generates every caller turn (sampled, recorded); its text is then replaced by
    the task's next reference call, so the random tiny model's episodes reach the rehearsal
    source (what an SFT warm start gives a real run)."""

    def __init__(self, inner: PolicyActor) -> None:
        self.inner = inner

    def act(self, views, turn):
        turns = self.inner.act(views, turn)
        for view, at in zip(views, turns):
            calls = view.task.reference.calls
            if at is not None and turn < len(calls):
                at.text = format_tool_call(calls[turn])
        return turns


def _rollout(backend: TransformersBackend, temperature: float):
    style = PromptStyle(max_examples=2, max_history_results=3)
    tasks = load_tasks("shop", "test", limit=2)
    actor = CallingActor(PolicyActor(backend, style=style, max_new_tokens=12, temperature=temperature, seed=3))
    source = ModelSource(backend, style=style, max_new_tokens=12, temperature=temperature, seed=4)
    trajs, _ = run_episodes(tasks, actor, source, RolloutConfig(group_size=3, max_turns=2))
    return trajs


def _assert_same_episodes(got, want) -> None:
    for a, b in zip(got, want):
        assert [m.content for m in a.messages] == [m.content for m in b.messages]
        assert [(s.role, s.prompt_ids, s.gen_ids) for s in a.samples] == \
               [(s.role, s.prompt_ids, s.gen_ids) for s in b.samples]
        for sa, sb in zip(a.samples, b.samples):
            torch.testing.assert_close(sa.logprobs, sb.logprobs, atol=1e-4, rtol=0)
        assert a.reward == b.reward


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_episodes_are_the_same_with_and_without_prefix_sharing(tiny_backend, temperature):
    backend = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, max_batch=8)
    backend.share_prefixes = False
    want = _rollout(backend, temperature)
    backend.share_prefixes = True
    got = _rollout(backend, temperature)
    assert len(got) == len(want) == 6
    assert {s.role for t in got for s in t.samples} == {"caller", "simulator"}
    _assert_same_episodes(got, want)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_episodes_are_the_same_with_key_value_reuse_across_turns(tiny_backend, temperature):
    want = _rollout(TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, max_batch=8), temperature)
    backend = TransformersBackend(tiny_backend.model, tiny_backend.tokenizer, max_batch=8, kv_reuse_tokens=50_000)
    got = _rollout(backend, temperature)
    store = backend.kv_store
    # later turns (and the simulator's calls after the first) started from earlier caches
    assert store is not None and store.reused_tokens > 0.2 * store.prompt_tokens
    _assert_same_episodes(got, want)
