"""The warm start without a world: references replayed from their recorded results, the tasks'
examples as simulator samples, replays a tool answered with an environment error dropped and
counted, and what a run says it used. Real objects throughout: a Python class world written to
disk, a task file whose results are recorded by replaying the references in that class, the tiny
random model's tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envace.core.prompts import PromptStyle
from envace.core.types import EnvRef, Task
from envace.envs.registry import resolve_world
from envace.policy.loading import load_model
from envace.rollout.sources import dump_result
from envace.train.sft import oracle_warm_start

PANTRY = '''
class Pantry:
    def reset(self, seed: int = 0) -> None:
        self.items = {"flour": 3 + seed, "rice": 5, "oats": 2}

    def stock(self, item: str) -> dict:
        """How many units of an item the pantry holds.

        Args:
            item: The item's name.
        """
        if item not in self.items:
            raise KeyError(f"no item {item!r}")
        return {"item": item, "units": self.items[item]}

    def take(self, item: str, units: int) -> dict:
        """Take units of an item out of the pantry.

        Args:
            item: The item's name.
            units: How many units to take.
        """
        left = self.stock(item)["units"] - units
        if left < 0:
            raise ValueError(f"only {left + units} {item} left")
        self.items[item] = left
        return {"item": item, "left": left}
'''


def _task(i: int, split: str, item: str = "flour") -> dict:
    left = 3 + i - 1 if item == "flour" else 0
    return {"id": f"pantry-{i}", "domain": "pantry", "split": split,
            "instruction": f"Take one {item} out of the pantry and tell me how many are left.",
            "checklist": [{"kind": "called", "tool": "take", "args": {"item": item, "units": 1}},
                          {"kind": "answer_contains", "text": str(left)}],
            "examples": [{"tool": "stock", "arguments": {"item": "rice"}, "result": {"item": "rice", "units": 5}},
                         {"tool": "stock", "arguments": {"item": "oats"}, "result": {"item": "oats", "units": 2}}],
            "env": {"args": {"seed": i}},
            "reference": {"calls": [{"name": "stock", "arguments": {"item": item}},
                                    {"name": "take", "arguments": {"item": item, "units": 1}}],
                          "answer": f"{left} {item} left."}}


@pytest.fixture(scope="module")
def pantry(tmp_path_factory) -> dict:
    """The world spec, its derived tool list, and task rows (6 train, 2 test) without results."""
    root = tmp_path_factory.mktemp("pantry")
    (root / "pantry.py").write_text(PANTRY)
    spec = f"{root / 'pantry.py'}:Pantry"
    provider = resolve_world(spec)
    tools = [t.model_dump(mode="json") for t in provider.tools()]
    provider.shutdown()
    rows = [dict(_task(i, "train" if i < 6 else "test"), tools=tools) for i in range(8)]
    return {"root": root, "spec": spec, "rows": rows}


def _recorded(rows: list[dict], spec: str) -> list[dict]:
    """The rows with each reference call's result recorded by replaying it in the real class."""
    provider = resolve_world(spec)
    out = []
    try:
        for row in rows:
            row = json.loads(json.dumps(row))
            env = provider.open(EnvRef(args=row["env"]["args"]))
            for call in row["reference"]["calls"]:
                call["result"] = json.loads(dump_result(env.call(call["name"], call["arguments"])))
            provider.close_environment(env)
            out.append(row)
    finally:
        provider.shutdown()
    return out


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tok():
    return load_model("tiny")[1]


def test_recorded_results_replay_the_reference_without_a_world_as_the_world_does(pantry, tok):
    rows = [r for r in pantry["rows"] if r["split"] == "train"]
    recorded = [Task.model_validate(r) for r in _recorded(rows, pantry["spec"])]
    plain = [Task.model_validate(r) for r in rows]
    data = oracle_warm_start(recorded, tok, PromptStyle(), example_tasks=recorded, example_limit=100)
    assert (data.in_world, data.from_records) == (0, len(recorded)) and not data.dropped
    callers = [s for s in data.samples if s.role == "caller"]
    sims = [s for s in data.samples if s.role == "simulator"]
    assert len(callers) == len(recorded)
    assert data.example_samples == 2 and len(sims) == 2 * len(recorded) + 2  # two calls each, two distinct examples
    # Each replayed call's simulator sample targets exactly the recorded result.
    replayed = sims[: 2 * len(recorded)]
    for task, pair in zip(recorded, zip(replayed[::2], replayed[1::2])):
        for call, sample in zip(task.reference.calls, pair):
            text = tok.decode(sample.gen_ids)
            assert text.startswith(dump_result(call.result)) and json.loads(dump_result(call.result)) == call.result
    # The caller sees the recorded results as the tool messages of its multi-turn sample.
    for task, sample in zip(recorded, callers):
        whole = tok.decode(sample.prompt_ids + sample.gen_ids)
        assert all(dump_result(c.result) in whole for c in task.reference.calls)
        assert task.reference.answer in whole
    # Examples teach the rehearse role: the example's call in the prompt, its result the target, and
    # the prompt grounds it on the other examples, not on itself.
    for sample in sims[2 * len(recorded):]:
        prompt, target = tok.decode(sample.prompt_ids), tok.decode(sample.gen_ids)
        (ex,) = [e for e in recorded[0].examples if target.startswith(dump_result(e.result))]
        assert f'Call: {json.dumps({"name": ex.tool, "arguments": ex.arguments})}' in prompt
        assert f"-> {json.dumps(ex.result)}" not in prompt
    # The same references replayed in the real class give the very same replay samples.
    world = oracle_warm_start(plain, tok, PromptStyle(), world=pantry["spec"])
    assert (world.in_world, world.from_records) == (len(plain), 0)
    assert [(s.prompt_ids, s.gen_ids) for s in world.samples] == [
        (s.prompt_ids, s.gen_ids) for s in data.samples[: len(world.samples)]]


def test_replays_answered_with_an_environment_error_are_dropped_and_counted(pantry, tok):
    rows = [r for r in pantry["rows"] if r["split"] == "train"][:3]
    broken = dict(_task(9, "train", item="sugar"), tools=rows[0]["tools"])  # the class has no sugar
    tasks = [Task.model_validate(r) for r in rows + [broken]]
    data = oracle_warm_start(tasks, tok, PromptStyle(), roles=["caller"], world=pantry["spec"])
    assert data.dropped == {"TOOL_EXECUTION_ERROR": ["pantry-9"]} and data.in_world == 3
    assert len(data.samples) == 3 and {s.group_id for s in data.samples} == {r["id"] for r in rows}
    assert "1 replays dropped: a call was answered TOOL_EXECUTION_ERROR" in data.describe()
    assert "pantry-9" in data.describe()
    # A recorded result from a crashed server is dropped the same way.
    crashed = _recorded(rows[:2], pantry["spec"])
    crashed[1]["reference"]["calls"][0]["result"] = {"error": {"code": "ENVIRONMENT_ERROR", "message": "gone"}}
    data = oracle_warm_start([Task.model_validate(r) for r in crashed], tok, PromptStyle(), roles=["caller"])
    assert data.dropped == {"ENVIRONMENT_ERROR": [crashed[1]["id"]]} and data.from_records == 1


def test_a_huge_recorded_result_is_capped_as_a_live_worlds_would_be(pantry, tok):
    """A result recorded in the file (reference or example) is cut with the marker a live world's
    result gets, so one huge record cannot stall the warm start."""
    from envace.envs.provider import MAX_RESULT_CHARS

    rows = _recorded([r for r in pantry["rows"] if r["split"] == "train"][:1], pantry["spec"])
    huge = {"item": "flour", "units": 3, "log": "x" * (3 * MAX_RESULT_CHARS)}
    rows[0]["reference"]["calls"][0]["result"] = huge
    rows[0]["examples"][0]["result"] = huge
    task = Task.model_validate(rows[0])
    data = oracle_warm_start([task], tok, PromptStyle(), example_tasks=[task], example_limit=10)
    sims = [tok.decode(s.gen_ids) for s in data.samples if s.role == "simulator"]
    cut = [t for t in sims if "[envace: result truncated:" in t]
    assert len(cut) == 2 and all(len(t) < MAX_RESULT_CHARS + 200 for t in cut)  # the replayed call and the example
    (caller,) = [s for s in data.samples if s.role == "caller"]
    assert "x" * (2 * MAX_RESULT_CHARS) not in tok.decode(caller.prompt_ids + caller.gen_ids)


def test_validate_refuses_a_reference_with_some_results_recorded(pantry, tmp_path):
    from envace.experiments.task_check import validate_task_file

    rows = _recorded(pantry["rows"][:2], pantry["spec"])
    del rows[1]["reference"]["calls"][1]["result"]
    path = _write(tmp_path / "tasks.jsonl", rows)
    n, problems = validate_task_file(path)
    assert n == 2 and len(problems) == 1
    (p,) = problems
    assert p.line == 2 and p.field.startswith("reference.calls") and "calls[1].result is missing" in p.message
    rows[1]["reference"]["calls"][0].pop("result")  # none recorded: a plain reference, valid
    assert validate_task_file(_write(tmp_path / "ok.jsonl", rows))[1] == []


def _train(tmp_path: Path, name: str, task_file: Path, *over: str) -> tuple[object, list[str]]:
    from envace.experiments.config import load_config
    from envace.experiments.train_job import train

    lines: list[str] = []
    cfg = load_config(None, ["model=tiny", "steps=0", "eval.at_start=false", "threads=1", "lora.r=2",
                             "sft.epochs=1", "rollout.caller_max_new_tokens=8", "rollout.simulator_max_new_tokens=8",
                             f"out={tmp_path / name}", *over], values={"task_file": str(task_file)})
    run = train(cfg, log=lambda *a: lines.append(" ".join(map(str, a))))
    return run, lines


def _sft_row(run) -> dict | None:
    return next((r for r in run.metrics() if r.get("phase") == "sft" and "sft/samples" in r), None)


def test_a_run_without_a_world_warm_starts_from_what_the_file_records(pantry, tmp_path):
    """The guard and the log: no world and nothing recorded -> skipped, saying why; examples
    alone -> a simulator-only warm start; recorded results -> caller samples too."""
    bare = [{k: v for k, v in r.items() if k != "examples"} for r in pantry["rows"]]
    run, lines = _train(tmp_path, "bare", _write(tmp_path / "bare.jsonl", bare))
    assert any(x.startswith("SFT warm start skipped: no train task has a reference to replay") for x in lines)
    assert _sft_row(run) is None and not (run.path / "sft").exists()

    run, lines = _train(tmp_path, "examples", _write(tmp_path / "examples.jsonl", pantry["rows"]))
    (said,) = [x for x in lines if x.startswith("warm start data:")]
    assert "0 caller samples from 0 reference replays" in said and "2 from recorded examples" in said
    assert "6 tasks skipped: no world and no recorded results in the reference (6)" in said
    row = _sft_row(run)
    assert row["sft/samples"] == 2 and row["sft/example_samples"] == 2 and (run.path / "sft").exists()

    run, lines = _train(tmp_path, "recorded", _write(tmp_path / "rec.jsonl", _recorded(pantry["rows"], pantry["spec"])),
                        "sft.caller_repeats=1")
    (said,) = [x for x in lines if x.startswith("warm start data:")]
    assert "6 caller samples from 6 reference replays (0 in a real world, 6 from recorded results)" in said
    assert "tasks skipped" not in said
    row = _sft_row(run)
    assert row["sft/replays_from_records"] == 6 and row["sft/samples"] == 6 + 12 + 2
    # the caller's samples weighed up against the recorded examples and results
    run, lines = _train(tmp_path, "repeats", _write(tmp_path / "rec.jsonl", _recorded(pantry["rows"], pantry["spec"])),
                        "sft.caller_repeats=3")
    assert _sft_row(run)["sft/samples"] == 3 * 6 + 12 + 2
    assert any(x.startswith("sft.caller_repeats=3: each epoch trains every caller sample 3 times (32 samples") for x in lines)


def test_eval_tasks_that_mix_real_and_no_world_are_refused_and_a_real_test_split_is_evaluated_for_real(
        pantry, tmp_path):
    """A file whose held-out tasks partly name a world is refused in one line; one whose held-out
    tasks all name their world is evaluated against it, while its train tasks warm-start from
    recorded results with no world."""
    rows = _recorded(pantry["rows"], pantry["spec"])
    test_rows = [r for r in rows if r["split"] == "test"]
    test_rows[0]["env"]["world"] = pantry["spec"]
    with pytest.raises(ValueError, match="1 of the 2 eval tasks have no real world .*pantry-7"):
        _train(tmp_path, "mixed", _write(tmp_path / "mixed.jsonl", rows), "sft.enabled=false", "eval.at_start=true",
               "trust_task_worlds=true")  # the file names a .py world: trusted, as a user would
    test_rows[1]["env"]["world"] = pantry["spec"]
    run, lines = _train(tmp_path, "split", _write(tmp_path / "split.jsonl", rows), "eval.at_start=true",
                        "eval.samples=1", "eval.temperature=0", "trust_task_worlds=true")
    assert any("evaluation: real-world on 2 test tasks" in x for x in lines)
    assert {r["eval_kind"] for r in run.metrics() if r["phase"] == "eval"} == {"real"}
    evals = [json.loads(x) for x in (run.path / "evals.jsonl").read_text().splitlines()]
    assert len(evals) == 2 and {e["source"] for e in evals} == {"real"}
    assert _sft_row(run)["sft/replays_from_records"] == 6


def test_the_plan_of_a_schema_only_run_names_its_eval_and_counts_its_tasks(pantry, tmp_path):
    from envace.experiments.config import load_config
    from envace.experiments.train_job import job_plan

    path = _write(tmp_path / "t.jsonl", pantry["rows"])
    plan = dict(job_plan(load_config(None, ["eval.every=5"], values={"task_file": str(path)}), False))
    assert "rehearsal-judged eval every 5" in plan["train"] and "real-world" not in plan["train"]
    assert plan["final eval"].startswith("rehearsal-judged on 2 tasks x")
    real = dict(job_plan(load_config(None, [], values={"task_file": str(path), "world": pantry["spec"]}), False))
    assert "real-world eval every 5" in real["train"] and real["final eval"].startswith("real-world on 2 tasks")
    sft_only = [name for name, _ in job_plan(load_config(None, ["steps=0"], values={"task_file": str(path)}), False)]
    assert sft_only == ["sft", "final eval"]  # no "0 GRPO steps" phase


def test_defaults_the_user_did_not_set_are_fitted_to_the_task_file_and_printed(pantry, tmp_path):
    from envace.experiments.config import load_config
    from envace.experiments.data_defaults import caller_turns, recorded_results
    from envace.experiments.train_job import fitted_to_data, job_plan

    rows = _recorded(pantry["rows"], pantry["spec"])
    long_result = [{"item": f"item-{k}", "units": k} for k in range(40)]  # far above the default cap of 64
    rows[0]["examples"].append({"tool": "stock", "arguments": {"item": "all"}, "result": long_result})
    path = _write(tmp_path / "t.jsonl", rows)
    tasks = [Task.model_validate(r) for r in rows if r["split"] == "train"]
    tok = load_model("tiny")[1]
    count = lambda texts: max(len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts)  # noqa: E731
    said: list[str] = []
    base = load_config(None, ["model=tiny"], values={"task_file": str(path)})
    cfg = fitted_to_data(base, said.append)
    longest_call, longest_result = count(caller_turns(tasks)) + 1, count(recorded_results(tasks))
    assert longest_result > 64
    for cap, longest in ((cfg.rollout.caller_max_new_tokens, longest_call),
                         (cfg.rollout.simulator_max_new_tokens, longest_result)):
        assert longest < cap <= 1.25 * longest + 24
    # 6 caller samples beside 12 replayed-call + 3 example samples: each caller sample 3 times an
    # epoch (33 samples, three updates an epoch), so the most epochs
    assert cfg.sft.caller_repeats == 3 and "sft.caller_repeats=3 (about 6 caller samples beside 15" in said[0]
    assert cfg.sft.epochs == 10
    assert cfg.eval.samples == 8 and cfg.eval.temperature == 0.5  # 2 held-out tasks
    (line,) = said
    for key, value in (("rollout.caller_max_new_tokens", cfg.rollout.caller_max_new_tokens),
                       ("rollout.simulator_max_new_tokens", cfg.rollout.simulator_max_new_tokens),
                       ("sft.epochs", 10), ("eval.samples", "8 at eval.temperature=0.5")):
        assert f"{key}={value} (" in line
    # The recipe that learned on the embedded worlds, for what the user left unset, each said.
    assert (cfg.rollout.temperature, cfg.rollout.simulator_temperature) == (0.7, 0.0)
    assert (cfg.grpo.anchor_coef, cfg.grpo.warmup_steps, cfg.grpo.norm_by_std) == (1.0, 3, True)
    assert cfg.eval.every == cfg.steps // 2
    assert cfg.sft.lr == 5e-4 and "sft.lr=0.0005 (" in line
    for key in ("rollout.temperature=0.7 (", "grpo.anchor_coef=1.0 (", f"eval.every={cfg.steps // 2} ("):
        assert key in line
    from envace.policy.loading import bf16_is_fast
    assert (cfg.mixed_precision == "bf16") == bf16_is_fast("cpu") == ("mixed_precision=bf16" in line)
    plan = dict(job_plan(cfg, False))
    assert "x 10 epochs" in plan["sft"] and plan["final eval"].endswith("2 tasks x 8 episodes")
    # What the user set stays as set, and is not mentioned.
    said.clear()
    mine = load_config(None, ["model=tiny", "rollout.caller_max_new_tokens=40", "sft.epochs=3", "eval.temperature=0",
                              "rollout.temperature=1.0", "grpo.anchor_coef=0", "mixed_precision=no", "sft.lr=1e-4"],
                       values={"task_file": str(path)})
    kept = fitted_to_data(mine, said.append)
    assert (kept.rollout.caller_max_new_tokens, kept.sft.epochs, kept.eval.samples) == (40, 3, 1)
    assert kept.sft.caller_repeats == 3  # still fitted: the user set the epochs, not the repeats
    assert (kept.rollout.temperature, kept.grpo.anchor_coef, kept.mixed_precision, kept.sft.lr) == (1.0, 0.0, "no", 1e-4)
    assert "sft.lr" not in said[0]
    assert "rollout.temperature=" not in said[0] and "anchor_coef" not in said[0] and "mixed_precision" not in said[0]
    assert kept.rollout.simulator_max_new_tokens == cfg.rollout.simulator_max_new_tokens
    assert "caller_max_new_tokens" not in said[0] and "sft.epochs" not in said[0] and "eval.samples" not in said[0]
    # The embedded worlds keep the shipped defaults.
    embedded = load_config(None, ["model=tiny"])
    assert fitted_to_data(embedded) is embedded


def test_a_warm_start_trained_on_other_tasks_starts_a_run_on_a_new_task_file(pantry, tmp_path, capsys):
    """configs/warmstart.yaml through ``envace sft`` (the embedded worlds' references), then a run
    on the pantry file with ``sft.init_from``: it starts from those weights and trains no warm
    start of its own."""
    from safetensors.torch import load_file

    from envace.cli.main import main
    from envace.train.checkpoint import resolve_checkpoint

    config = Path(__file__).resolve().parents[2] / "configs" / "warmstart.yaml"
    small = ["--model", "tiny", "--set", "worlds=[bank]", "--set", "sft.trajectories=2", "--set", "sft.epochs=1",
             "--set", "lora.r=2", "--set", "threads=1", "--set", f"out={tmp_path / 'ws'}"]
    assert main(["sft", "--config", str(config), *small]) == 0
    (made,) = (tmp_path / "ws").iterdir()
    run, lines = _train(tmp_path, "user", _write(tmp_path / "t.jsonl", pantry["rows"]),
                        f"sft.init_from={made / 'sft'}")
    assert any(x.startswith(f"SFT warm start loaded from {made / 'sft'}") for x in lines)
    assert not any(x.startswith("warm start data:") for x in lines)
    a, b = (load_file(str(resolve_checkpoint(p) / "adapter_model.safetensors")) for p in (made / "sft", run.path / "sft"))
    assert a.keys() == b.keys() and a and all(a[k].equal(b[k]) for k in a)
    assert any(v.abs().sum() > 0 for k, v in a.items() if "lora_B" in k)  # the warm start trained the adapter


def test_a_schema_only_run_is_evaluated_against_the_real_tools_with_eval_world(pantry, tmp_path):
    """``eval.world``: training never touches a world (the warm start from recorded results, nothing
    replayed), the evals run in the real class, real-world judged, paired with a rehearsal-judged run."""
    rows = _recorded(pantry["rows"], pantry["spec"])
    path = _write(tmp_path / "t.jsonl", rows)
    run, lines = _train(tmp_path, "eval-world", path, "eval.at_start=true", "eval.samples=1", "eval.temperature=0",
                        f"eval.world={pantry['spec']}")
    assert _sft_row(run)["sft/replays_from_records"] == 6  # the warm start saw no world
    assert any(f"evaluation: real-world on 2 test tasks (world {pantry['spec']})" in x for x in lines), lines
    assert {r["eval_kind"] for r in run.metrics() if r["phase"] == "eval"} == {"real"}
    evals = [json.loads(x) for x in (run.path / "evals.jsonl").read_text().splitlines()]
    assert {e["source"] for e in evals} == {"real"}
    # without it the same run is judged by rehearsal
    run, lines = _train(tmp_path, "no-eval-world", path, "eval.at_start=true", "eval.samples=1", "eval.temperature=0")
    assert {r["eval_kind"] for r in run.metrics() if r["phase"] == "eval"} == {"rehearsal"}
    from envace.experiments.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="eval.world: with source real"):
        load_config(None, ["model=tiny", "source=real", f"world={pantry['spec']}", f"eval.world={tmp_path}/x.py:X"],
                    values={"task_file": str(path)})
