import json

import pytest

from envace.core.prompts import MEMORY_HEADER, PromptStyle, render_caller_prompt
from envace.rollout.actors import OracleActor, PolicyActor
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource
from envace.testtime import (
    MemoryActor,
    RecordingRealSource,
    RuleMemoryWriter,
    budget_sweep,
    check_mode_budget,
    commit,
    commit_condition,
    rehearse,
    run_private_rehearsal,
)

from testtime_helpers import AttemptActor, few_tasks


def sim(backend, **kw):
    return ModelSource(backend, name="rehearsal", record_samples=False, max_new_tokens=kw.pop("max_new_tokens", 12),
                       temperature=kw.pop("temperature", 0.7), seed=kw.pop("seed", 0), **kw)


@pytest.fixture(scope="module")
def tasks():
    return few_tasks("shop", 2) + few_tasks("bank", 1)


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_no_real_call_during_rehearsal_and_the_committed_run_calls_the_world(tiny_backend, tasks, mode):
    real = RecordingRealSource()  # made before rehearsing; it builds worlds only when an episode starts
    # every response generated (the oracle's recorded reads would be answered as recorded)
    rset = rehearse(tasks, OracleActor(), sim(tiny_backend, examples_as_recorded=False), mode, 2, RuleMemoryWriter())
    assert real.worlds == [] and real.total_calls() == 0  # no world exists, so none was called
    for t in tasks:
        attempts = rset.attempts[t.id]
        assert [a.attempt for a in attempts] == [0, 1]
        for a in attempts:
            tool_msgs = [m for m in a.trajectory.messages if m.role == "tool"]
            assert a.trajectory.source == "rehearsal" and tool_msgs
            assert all(m.rehearsed for m in tool_msgs)  # every response imagined by the model
            assert a.simulator_tokens > 0 and a.trajectory.samples == []  # record_samples=False
    result = commit_condition(tasks, OracleActor(), rset, 2, RuleMemoryWriter(), real_source=real)
    assert result.real_calls_during_rehearsal == 0
    for t, o in zip(tasks, result.outcomes):
        assert o.real_calls == len(t.reference.calls) > 0 and o.success
        assert all(m.rehearsed is False for m in o.trajectory.messages if m.role == "tool")
        assert o.memory.source == "rule" and o.memory.text.startswith("2 imagined attempts.")
        assert o.rehearsal_tokens == sum(a.tokens for a in rset.attempts[t.id]) > 0
    assert [tid for tid, _ in real.worlds] == [t.id for t in tasks]


def test_rehearsal_refuses_the_real_world(tasks):
    with pytest.raises(ValueError, match="must not call the real world"):
        rehearse(tasks, OracleActor(), RealSource(), "parallel", 2)


def test_parallel_is_one_batched_group(tiny_backend, tasks):
    actor = AttemptActor()  # counts turn-0 calls: one per run_episodes call
    rset = rehearse(tasks, actor, sim(tiny_backend), "parallel", 3)
    assert actor.attempt == 0 and len(actor.memories[0]) == 3 * len(tasks)  # all 9 episodes in one call
    assert all(m == "" for m in actor.memories[0])
    assert all(len(rset.attempts[t.id]) == 3 and not any(a.memory_seen for a in rset.attempts[t.id]) for t in tasks)


def test_sequential_attempt_k_sees_the_attempts_before_it(tiny_backend, tasks):
    actor = AttemptActor()
    rset = rehearse(tasks, actor, sim(tiny_backend), "sequential", 3, RuleMemoryWriter())
    assert actor.attempt == 2
    for t in tasks:
        seen = [a.memory_seen for a in rset.attempts[t.id]]
        assert seen[0] == ""
        for k in (1, 2):
            assert seen[k].startswith(f"{k} imagined attempt")
            for j in range(3):
                assert (f'"q{j}"' in seen[k]) == (j < k), (k, j, seen[k])
            assert f"answer-{k - 1}" in seen[k] and f"answer-{k}" not in seen[k]  # ties: the latest answer
    # what each attempt's views carried is the memory recorded for it
    for k in range(3):
        assert actor.memories[k] == [rset.attempts[t.id][k].memory_seen for t in tasks]


def test_memory_reaches_the_committed_callers_prompt(tiny_backend, tasks):
    style = PromptStyle()
    actor = PolicyActor(tiny_backend, style=style, max_new_tokens=6, temperature=0.0)
    memory = "2 imagined attempts.\nFailed calls:\n- get_order {\"order_id\": \"o-1\"} -> NOT_FOUND"
    real = RecordingRealSource()
    trajs = commit(tasks[:2], actor, real, {tasks[0].id: memory}, max_turns=1)
    tok = tiny_backend.tokenizer
    with_mem = tok.decode(trajs[0].samples[0].prompt_ids)
    assert MEMORY_HEADER in with_mem and memory in with_mem
    assert with_mem.index(memory) < with_mem.index(tasks[0].instruction)  # in the system message
    # a task without memory gets exactly the plain prompt
    assert trajs[1].samples[0].prompt_ids == render_caller_prompt(tok, tasks[1], [], style)
    assert MEMORY_HEADER not in tok.decode(trajs[1].samples[0].prompt_ids)


def test_memory_actor_leaves_the_oracle_alone(tasks):
    real = RecordingRealSource()
    trajs = commit(tasks, MemoryActor(OracleActor(), {}), real, {t.id: "notes" for t in tasks}, max_turns=4)
    assert all(t.reward == 1.0 for t in trajs)
    assert real.calls_by_task() == {t.id: len(t.reference.calls) for t in tasks}


def test_run_private_rehearsal_and_the_sweep_count_costs(tiny_backend, tasks):
    result, rset = run_private_rehearsal(tasks[:1], OracleActor(), OracleActor(), sim(tiny_backend), "parallel", 2)
    assert rset is not None and result.name == "parallel-2" and result.real_calls_during_rehearsal == 0
    none, no_rset = run_private_rehearsal(tasks[:1], OracleActor(), OracleActor(), sim(tiny_backend), "none", 0)
    assert no_rset is None and none.outcomes[0].memory.source == "none" and none.outcomes[0].rehearsal_tokens == 0

    results, rsets = budget_sweep(tasks[:1], OracleActor(), OracleActor(), sim(tiny_backend), [2, 0, 1])
    assert [r.name for r in results] == ["none", "parallel-1", "parallel-2", "sequential-1", "sequential-2"]
    assert set(rsets) == {"parallel", "sequential"} and all(rs.budget == 2 for rs in rsets.values())
    assert all(r.real_calls_during_rehearsal == 0 for r in results)
    by = {r.name: r.outcomes[0] for r in results}
    assert by["none"].rehearsal_tokens == 0 < by["parallel-1"].rehearsal_tokens < by["parallel-2"].rehearsal_tokens
    assert by["sequential-1"].rehearsal_tokens < by["sequential-2"].rehearsal_tokens
    # budget b uses the first b attempts: sequential's memory after 1 attempt is what attempt 2 saw
    assert by["sequential-1"].memory.text == rsets["sequential"].attempts[tasks[0].id][1].memory_seen
    assert all(o.real_calls == len(tasks[0].reference.calls) for o in by.values())
    row = by["parallel-2"].to_row()
    json.dumps(row)
    assert row["condition"] == "parallel-2" and row["tokens"]["total"] == by["parallel-2"].tokens


@pytest.mark.parametrize("mode,budget,msg", [
    ("parallel", 0, "needs a budget >= 1"), ("sequential", -2, "needs a budget >= 1"),
    ("beam", 2, "unknown rehearse mode"), ("none", 3, "needs --rehearse parallel or sequential"),
    ("parallel", 1.5, "must be an integer"),
])
def test_mode_and_budget_checks(mode, budget, msg):
    with pytest.raises(ValueError, match=msg):
        check_mode_budget(mode, budget)


def test_sweep_rejects_negative_budgets(tasks):
    with pytest.raises(ValueError, match=">= 0"):
        budget_sweep(tasks, OracleActor(), OracleActor(), None, [0, -1])


def test_training_episodes_with_a_memory_see_the_tasks_other_episodes(tiny_backend, tasks):
    from envace.rollout.engine import RolloutConfig
    from envace.testtime import episodes_with_memory
    from envace.train.advantages import compute_advantages

    actor = PolicyActor(tiny_backend, style=PromptStyle(), max_new_tokens=8, temperature=1.0, seed=3)
    trajs, stats, memories = episodes_with_memory(tasks, actor, sim(tiny_backend), RolloutConfig(group_size=3,
                                                  max_turns=2), with_memory=1)
    tok = tiny_backend.tokenizer
    assert [(t.task_id, t.trajectory_index) for t in trajs] == [(t.id, g) for t in tasks for g in range(3)]
    assert stats.episodes == 9 and stats.caller_tokens > 0
    for t in tasks:
        mine = [tr for tr in trajs if tr.task_id == t.id]
        assert memories[t.id] == RuleMemoryWriter().write([(t, mine[:2])])[0].text
        assert memories[t.id].startswith("2 imagined attempts.")
        for tr in mine:
            prompt = tok.decode(tr.samples[0].prompt_ids)
            assert (MEMORY_HEADER in prompt) == (tr.trajectory_index == 2)
            assert all(s.trajectory_index == tr.trajectory_index and s.group_id == t.id for s in tr.samples)
    assert memories[tasks[0].id] in tok.decode(trajs[2].samples[0].prompt_ids)
    # one advantage pool per task: the memory episode is centred with the plain ones
    scored = compute_advantages(trajs)
    assert {s.sample.group_id for s in scored} <= {t.id for t in tasks}
    with pytest.raises(ValueError, match="at least one episode per task plays plain"):
        episodes_with_memory(tasks, actor, sim(tiny_backend), RolloutConfig(group_size=2), with_memory=2)
    with pytest.raises(ValueError, match="distinct ids"):
        episodes_with_memory(tasks[:1] * 2, actor, sim(tiny_backend), RolloutConfig(group_size=2), with_memory=1)
    plain, _, none = episodes_with_memory(tasks, actor, sim(tiny_backend), RolloutConfig(group_size=2,
                                          max_turns=1), with_memory=0)
    assert none == {} and len(plain) == 6
    assert not any(MEMORY_HEADER in tok.decode(tr.samples[0].prompt_ids) for tr in plain)
