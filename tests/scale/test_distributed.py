"""Multi-process GRPO through accelerate: 2 CPU processes on gloo take the same update as one
process on the same global batch (tiny model), and the helpers around it."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from scale_helpers import finish, launch_two, make_anchor, make_trajectories, make_updaters, tiny_models

from envace.train import distributed as dist
from envace.train.advantages import compute_advantages
from envace.train.modes import ModeSpec
from envace.train.step import update_for_mode

HERE = Path(__file__).parent
TIMEOUT_S = 240  # a loaded 2-core box imports torch + transformers twice in ~20 s; normally ~10 s


def _launch_two(out: Path, parallel: str) -> subprocess.Popen:
    """The documented launcher: ``accelerate launch`` with 2 processes (on a machine without GPUs
    accelerate runs them on CPU with the gloo backend)."""
    return launch_two([str(HERE / "ddp_worker.py"), str(out), parallel], HERE)


def _wait(proc: subprocess.Popen) -> tuple[int, str]:
    code, output = finish(proc, TIMEOUT_S)
    return code, output[-6000:]


@pytest.mark.parametrize("parallel", ["ddp", pytest.param("fsdp", marks=pytest.mark.slow)])
def test_two_processes_take_the_one_process_update(tmp_path, parallel):
    launcher = _launch_two(tmp_path, parallel)  # the ranks start while this process computes the reference
    torch.set_num_threads(1)
    caller, simulator, tok = tiny_models()
    start = {"caller": {k: v.clone() for k, v in caller.state_dict().items()},
             "simulator": {k: v.clone() for k, v in simulator.state_dict().items()}}
    trajs = make_trajectories(caller, len(tok))
    ref_updaters = make_updaters(caller, simulator)
    ref_stats = update_for_mode(ModeSpec.for_mode("noshare"), ref_updaters, compute_advantages(trajs),
                                anchor=make_anchor(len(tok)))
    ref = {"caller": caller.state_dict(), "simulator": simulator.state_dict()}
    code, output = _wait(launcher)
    assert code == 0, f"accelerate launch exited {code}:\n{output}"
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    per_rank = [sum(len(t.samples) for t in trajs if t.task_id in tasks) for tasks in (("t0", "t2"), ("t1",))]
    assert [r["local_samples"] for r in ranks] == per_rank  # uneven shards: tasks t0, t2 vs t1

    for key in ("caller", "simulator"):
        moved = max((ref[key][k] - start[key][k]).abs().max().item() for k in ref[key])
        assert moved > 1e-4, f"{key}: the reference update did not move the weights"
        for r in ranks:
            for name, want in ref[key].items():
                # Same update to float rounding (the SGD-trained caller's update is 0.5 x gradient:
                # a wrongly normalised or unsynchronised gradient would be off by far more).
                torch.testing.assert_close(r[key][name] - start[key][name], want - start[key][name],
                                           rtol=1e-4, atol=1e-6, msg=f"{key} {name}")
        for name in ref[key]:
            assert torch.equal(ranks[0][key][name], ranks[1][key][name])  # the replicas agree exactly
    # What rank 0 checkpoints of the AdamW state (under FSDP gathered from the shards, keyed by
    # parameter name) is the 1-process state, parameter by parameter in the optimiser's order.
    got_opt, want_opt = ranks[0]["optimizers"]["simulator"], ref_updaters["simulator"].optimizer.state_dict()
    got_keys = [k for g in got_opt["param_groups"] for k in g["params"]]
    want_keys = [k for g in want_opt["param_groups"] for k in g["params"]]
    assert len(got_keys) == len(want_keys)
    assert all(isinstance(k, str) for k in got_keys) == (parallel == "fsdp")  # names: gathered by FSDP
    for g, w in zip(got_keys, want_keys):
        for field in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(got_opt["state"][g][field], want_opt["state"][w][field], rtol=1e-4, atol=1e-9)
        assert float(got_opt["state"][g]["step"]) == float(want_opt["state"][w]["step"]) == 2.0

    stats = ranks[0]["stats"]
    assert stats == ranks[1]["stats"]
    for k in ("caller/loss", "caller/grad_norm", "simulator/loss", "caller/entropy", "simulator/ratio_mean",
              "caller/anchor_nll", "simulator/anchor_nll"):
        assert stats[k] == pytest.approx(ref_stats[k], rel=1e-4, abs=1e-6), k
    for k in ("caller/tokens", "caller/samples/caller", "simulator/tokens", "caller/skipped_zero_adv",
              "simulator/optimizer_steps", "caller/optimizer_steps", "caller/merged_away"):
        assert stats[k] == ref_stats[k], k
    # merge_turns ran on both sides (one updater): the caller's later turns rode along in their
    # trajectory's merged sequence, and the weights above still match the one-process update.
    assert ref_stats["caller/merged_away"] > 0
    assert stats["caller/processes"] == 2.0


def test_single_process_path_is_update_for_mode():
    torch.set_num_threads(1)
    a_caller, a_sim, tok = tiny_models()
    b_caller, b_sim, _ = tiny_models()
    trajs = make_trajectories(a_caller, len(tok))
    spec = ModeSpec.for_mode("noshare")
    assert dist.make_accelerator() is None  # not launched: no accelerate state at all
    ups = dist.prepare_updaters(None, make_updaters(a_caller, a_sim))
    assert dist.optimizers_of(ups) == {k: u.optimizer for k, u in ups.items()}
    dist.barrier(None)
    got = update_for_mode(spec, ups, dist.compute_advantages_global(None, trajs))
    want = update_for_mode(spec, make_updaters(b_caller, b_sim), compute_advantages(trajs))
    assert got == want
    for m, n in ((a_caller, b_caller), (a_sim, b_sim)):
        assert all(torch.equal(x, y) for x, y in zip(m.state_dict().values(), n.state_dict().values()))


def test_shards_seeds_and_stats_merge():
    ranks = [SimpleNamespace(num_processes=3, process_index=r) for r in range(3)]
    tasks = list("abcdefg")
    shards = [dist.shard_tasks(tasks, a) for a in ranks]
    assert shards == [["a", "d", "g"], ["b", "e"], ["c", "f"]]
    assert sorted(t for s in shards for t in s) == tasks
    assert dist.shard_tasks(tasks, None) == tasks
    assert len({dist.rank_seed(5, a) for a in ranks}) == 3 and dist.rank_seed(5, ranks[0]) == 5
    assert dist.rank_seed(None, ranks[1]) is None

    merged = dist.merge_rank_stats([
        {"loss": 0.4, "loss/caller": 0.4, "tokens": 10.0, "samples/caller": 2.0, "ratio_mean": 1.0, "ratio_max": 1.5,
         "micro_batches": 3.0, "padding_frac": 0.2},
        {"loss": 0.2, "loss/caller": 0.2, "tokens": 30.0, "samples/caller": 4.0, "ratio_mean": 2.0, "ratio_max": 1.2,
         "micro_batches": 1.0, "padding_frac": 0.4}])
    assert merged["loss"] == pytest.approx(0.3) and merged["loss/caller"] == pytest.approx(0.3)
    assert merged["tokens"] == 40.0 and merged["samples/caller"] == 6.0
    assert merged["ratio_mean"] == pytest.approx(1.75) and merged["ratio_max"] == 1.5
    assert merged["micro_batches"] == 3.0 and merged["padding_frac"] == pytest.approx(0.3)


def test_saved_optimizer_states_are_renamed_by_position_for_fsdp():
    """A resume under FSDP takes both a gathered state (keyed by name) and a DDP / one-process one
    (keyed by index): entries map to the optimiser's parameters by position."""
    model = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Linear(3, 1))
    model[0].bias.requires_grad_(False)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=0.1)
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    plain = opt.state_dict()
    names = ["0.weight", "1.weight", "1.bias"]
    by_name = dist._keyed_by_name(plain, model, opt)
    assert by_name["param_groups"][0]["params"] == names and list(by_name["state"]) == names
    assert torch.equal(by_name["state"]["1.bias"]["exp_avg"], plain["state"][2]["exp_avg"])
    assert dist._keyed_by_name(by_name, model, opt) == by_name
    other = torch.nn.Linear(2, 1)
    with pytest.raises(ValueError, match="3 parameters, the model 2"):
        dist._keyed_by_name(plain, other, torch.optim.SGD(other.parameters(), lr=1))


def test_accelerate_sharded_engines_are_refused_with_a_pointer_to_parallel_fsdp():
    for kind in ("FSDP", "DEEPSPEED"):
        with pytest.raises(ValueError, match="parallel: fsdp") as err:
            dist.require_replicated(SimpleNamespace(distributed_type=kind))
        assert "DeepSpeed is not supported" in str(err.value)
    dist.require_replicated(SimpleNamespace(distributed_type="MULTI_CPU"))  # DDP, and parallel: fsdp on top of it


def test_unprepared_updaters_are_refused_on_several_processes(monkeypatch):
    caller, simulator, tok = tiny_models()
    ups = make_updaters(caller, simulator)
    scored = compute_advantages(make_trajectories(caller, len(tok)))
    monkeypatch.setenv("WORLD_SIZE", "2")  # one of two processes, but no accelerator attached
    with pytest.raises(ValueError, match="prepare_updaters"):
        update_for_mode(ModeSpec.for_mode("noshare"), ups, scored)

