"""The evaluation job behind ``envace eval``: private rehearsal, the budget sweep, fidelity.

What one job can do (any combination):

* a single condition: ``rehearse`` none (the plain real-world run), parallel or sequential with
  ``budget`` imagined episodes per task, then one committed real run per task;
* ``sweep``: every budget of ``budgets`` (0 = no rehearsal) for every mode of ``modes``;
* ``fidelity``: rehearse every real response of real trajectories (the scripted oracle's, the
  policy's own, or both; plus error probes) greedily and compare with the real world;
* ``rehearsal_gap`` (on by default): beside the plain real run (budget 0), the same policy on the
  same tasks rehearsing every tool response, judged as a rehearsal training step judges it, with
  the rehearse role's fidelity on the calls of the real episodes and on the recorded examples,
  and each episode's failure class (experiments/gap.py, experiments/failures.py).

Files of the run directory (kind ``eval``): ``committed.jsonl`` (one row per task and
condition: memory, costs, the committed trajectory), ``rehearsals.jsonl`` (the imagined
episodes), ``fidelity.jsonl`` (rehearsed vs real response pairs), ``metrics.jsonl`` (one row
per condition and per fidelity group, and a ``gap`` row), ``rehearsal_judged.jsonl``,
``gap_fidelity.jsonl`` and ``failures.jsonl`` (the rehearsal gap), then ``summary.md``, ``sweep.png``, ``fidelity.png`` and
``viewer.html`` from :func:`envace.experiments.eval_report.write_eval_report`.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from envace.core.prompts import PromptStyle
from envace.core.types import Task
from envace.experiments.eval_models import EvalModels, load_eval_backend, resolve_eval_models
from envace.experiments.eval_report import condition_table, print_eval_summary, write_eval_report
from envace.experiments.factory import GenerationSettings, load_backend, make_actor
from envace.experiments.failures import failure_rows
from envace.experiments.gap import failure_metrics, gap_metrics, gap_sources, run_gap
from envace.experiments.rundir import RunDir
from envace.experiments.tasks import select_tasks
from envace.envs.registry import world_names
from envace.policy.allocator import DEFAULT_MMAP_THRESHOLD, cap_heap_blocks
from envace.policy.threads import apply_threads
from envace.reward.judge import ModelJudge
from envace.rollout.actors import OracleActor, PolicyActor
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.stats import log_turns
from envace.rollout.rehearse import ModelSource
from envace.rollout.sources import RealSource
from envace.testtime.fidelity import (
    cases_from_trajectories,
    error_probe_cases,
    measure_fidelity,
    summarize_fidelity,
)
from envace.testtime.memory import MEMORY_KINDS, make_memory_writer
from envace.testtime.rehearsal import (
    MODES,
    REHEARSE_MODES,
    budget_sweep,
    check_mode_budget,
    run_private_rehearsal,
)

DEFAULT_BUDGETS = (0, 1, 2, 4, 8)
FIDELITY_SOURCES = ("oracle", "policy", "both")


@dataclass
class EvalJob:
    model: str = "smollm2"
    # Fields left None take the training run's value when ``model`` is a run's checkpoint (a model
    # is evaluated on its training distribution by default), else the defaults in RUN_DEFAULTS.
    world: str | None = None  # embedded world(s): a name, a comma list or "all"
    real_world: Any = None  # with task_file: the real environment of tasks that name none (--world)
    judge_model: str | None = None  # judge of `judge` checklist items (None: they are not judged)
    sim_model: str | None = None  # the model that rehearses (test-time rehearsal, fidelity); None: model's
    task_file: str | None = None
    trust_task_worlds: bool = False  # the task file's own env.world entries may run code (docs/tasks.md)
    split: str = "test"
    tasks: int = 10  # per world (or in all, for a task file)
    rehearse: str = "none"  # none | parallel | sequential
    budget: int | None = None  # imagined episodes per task (default 4 with a rehearse mode)
    sweep: bool = False
    budgets: list[int] = field(default_factory=lambda: list(DEFAULT_BUDGETS))
    modes: list[str] = field(default_factory=lambda: list(REHEARSE_MODES))
    memory: str = "model"  # model (the policy summarises; rule-based fallback) | rule | plan
    fidelity: bool = False
    fidelity_source: str = "oracle"  # oracle | policy | both
    fidelity_tasks: int | None = None  # per world; default: tasks
    error_probes: bool = True
    difficulties: list[int] | None = None  # embedded task generator settings (as in training configs)
    tool_distractors: int | None = None
    tasks_per_world: int | None = None
    n_examples: int | None = None
    grounding: str | None = None
    max_turns: int | None = None
    max_new_tokens: int | None = None  # caller turns
    sim_max_new_tokens: int | None = None  # rehearsed tool responses during rehearsal
    fidelity_max_new_tokens: int = 256  # rehearsed tool responses for fidelity (real ones run long)
    simulator_context: str | None = None  # call | conversation (None: the run's prompt style, else call)
    rehearsal_gap: bool = True  # the plain real run also rehearsal-judged, with fidelity and failure classes
    examples_as_recorded: bool | None = None  # recorded calls answered as recorded (None: the run's, else on)
    summary_max_new_tokens: int = 96
    memory_max_chars: int = 600
    rehearsal_temperature: float = 0.7
    temperature: float = 0.0  # the committed run (0 = greedy)
    max_batch: int = 16
    seed: int = 0
    threads: int | None = None
    device: str = "cpu"
    dtype: str = "float32"  # generation: float32 | bfloat16 (a cast copy of the model)
    kv_reuse_tokens: int = 0  # key/value caches kept between turns (policy/kv_reuse.py); 0: off
    llamacpp_quant: str | None = None  # generate on llama.cpp, the weights in this encoding (F32 BF16 Q8_0 Q4_1)
    out: str = "runs"
    name: str | None = None

    @property
    def runs_testtime(self) -> bool:
        """Fidelity alone skips the committed runs; otherwise at least the budget-0 run happens."""
        return self.sweep or self.rehearse != "none" or self.budget not in (None, 0) or not self.fidelity


# job field -> (where it sits in a training run's config.yaml, the default without a run).
# tool_distractors and difficulties default to None (every tool, every difficulty).
RUN_DEFAULTS: dict[str, tuple[tuple[str, ...], Any]] = {
    "world": (("worlds",), "shop"),
    "difficulties": (("difficulties",), None),
    "tool_distractors": (("tool_distractors",), None),
    "tasks_per_world": (("tasks_per_world",), 300),
    "n_examples": (("n_examples",), 3),
    "grounding": (("grounding",), "covering"),
    "max_turns": (("rollout", "max_turns"), 4),
    "max_new_tokens": (("rollout", "caller_max_new_tokens"), 96),
    "sim_max_new_tokens": (("rollout", "simulator_max_new_tokens"), 96),
    "examples_as_recorded": (("rollout", "examples_as_recorded"), True),
}


def with_run_settings(job: EvalJob, run_config: dict[str, Any] | None) -> tuple[EvalJob, list[str]]:
    """``job`` with every field it leaves None filled from the training run's config (a checkpoint
    is evaluated on the task distribution and turn limits it was trained on), else the default;
    and a note of what came from the run. A task file or --world given on the command line wins."""
    values: dict[str, Any] = {}
    taken: list[str] = []
    cfg = run_config or {}
    from_run = bool(cfg) and not job.task_file and (cfg.get("task_file") is None or job.world is not None)
    if cfg and not job.task_file and job.world is None and cfg.get("task_file"):
        values["task_file"] = cfg["task_file"]  # the run trained on a task file: evaluate on it
        values["real_world"] = job.real_world if job.real_world is not None else cfg.get("world")
        taken.append(f"task_file={cfg['task_file']}")
    for name, (path, default) in RUN_DEFAULTS.items():
        if getattr(job, name) is not None:
            continue
        value: Any = cfg
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None and (from_run or name in ("max_turns", "max_new_tokens", "sim_max_new_tokens",
                                                        "examples_as_recorded")):
            if name == "world":
                value = ",".join(value) if isinstance(value, list) else str(value)
            values[name] = value
            taken.append(f"{name}={value}")
        else:
            values[name] = default
    notes = [f"evaluating on the training run's settings ({', '.join(taken)}); flags override them"] if taken else []
    return dataclasses.replace(job, **values), notes


def parse_int_list(text: str, what: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{what} must be a comma list of integers, got {text!r}") from None


def effective_budget(job: EvalJob) -> int:
    """Checks ``rehearse``/``budget``; returns the budget of the single condition."""
    budget = job.budget
    if job.rehearse not in MODES:
        raise ValueError(f"unknown rehearse mode {job.rehearse!r}; choose one of {', '.join(MODES)}")
    if budget is None:
        budget = 0 if job.rehearse == "none" else 4
    check_mode_budget(job.rehearse, budget)
    return budget


def validate_job(job: EvalJob) -> int:
    """Every check that needs no model, so bad input fails in a second with the reason."""
    if job.tasks < 1:
        raise ValueError(f"--tasks must be >= 1, got {job.tasks}")
    if job.fidelity_tasks is not None and job.fidelity_tasks < 1:
        raise ValueError(f"--fidelity-tasks must be >= 1, got {job.fidelity_tasks}")
    if job.max_turns < 1:
        raise ValueError(f"--max-turns must be >= 1, got {job.max_turns}")
    for name in ("max_new_tokens", "sim_max_new_tokens", "fidelity_max_new_tokens", "summary_max_new_tokens",
                 "max_batch"):
        if getattr(job, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(job, name)}")
    if job.kv_reuse_tokens < 0:
        raise ValueError(f"--kv-reuse-tokens must be >= 0, got {job.kv_reuse_tokens}")
    if job.temperature < 0 or job.rehearsal_temperature < 0:
        raise ValueError("temperatures must be >= 0")
    if job.memory not in MEMORY_KINDS:
        raise ValueError(f"unknown memory kind {job.memory!r}; choose one of {', '.join(MEMORY_KINDS)}")
    if job.fidelity_source not in FIDELITY_SOURCES:
        raise ValueError(f"unknown fidelity source {job.fidelity_source!r}; choose one of {', '.join(FIDELITY_SOURCES)}")
    if job.split not in ("train", "test"):
        raise ValueError(f"--split must be train or test, got {job.split!r}")
    if job.sweep:
        if job.rehearse != "none" or job.budget is not None:
            raise ValueError("--sweep runs every budget of --budgets for every mode of --modes; "
                             "drop --rehearse/--budget")
        if not job.budgets:
            raise ValueError("--budgets is empty")
        bad = [b for b in job.budgets if isinstance(b, bool) or not isinstance(b, int) or b < 0]
        if bad:
            raise ValueError(f"sweep budgets must be integers >= 0 (0 = no rehearsal), got {bad}")
        unknown = [m for m in job.modes if m not in REHEARSE_MODES]
        if unknown or not job.modes:
            raise ValueError(f"sweep modes must be among {', '.join(REHEARSE_MODES)}, got {job.modes}")
        return 0
    return effective_budget(job)


def world_list(job: EvalJob) -> list[str]:
    if job.task_file:
        return []
    names = world_names() if job.world in (None, "", "all") else [w.strip() for w in job.world.split(",") if w.strip()]
    unknown = [w for w in names if w not in world_names()]
    if unknown or not names:
        raise ValueError(f"unknown world(s) {unknown or job.world!r}; known: {', '.join(world_names())}")
    return names


def eval_tasks(job: EvalJob, per_world: int) -> list[Task]:
    """``per_world`` tasks of each world's split (or of the task file), all with a real world."""
    if job.task_file:
        tasks = select_tasks(None, job.split, per_world, job.task_file, difficulties=job.difficulties,
                             real_world=job.real_world, trust_task_worlds=job.trust_task_worlds)
    else:
        tasks = []
        for w in world_list(job):
            try:
                tasks += select_tasks(w, job.split, per_world, difficulties=job.difficulties,
                                      tool_distractors=job.tool_distractors, n_examples=job.n_examples,
                                      grounding=job.grounding, tasks_per_world=job.tasks_per_world)
            except ValueError:
                raise ValueError(f"world {w!r} has no {job.split} split tasks") from None
    missing = [t.id for t in tasks if (t.env is None or t.env.world is None) and job.real_world is None]
    if missing:
        raise ValueError(f"evaluation runs against the real world, but {len(missing)} task(s) name no world "
                         f"(e.g. {missing[0]}): give their env.world, or --world")
    return tasks


@dataclass
class EvalParts:
    """What a job runs with, built from a job and its loaded backends (also used by tests)."""

    commit_actor: Any
    rehearsal_actor: Any
    simulator: Any  # the rehearsal source: the policy (or a checkpoint's simulator) rehearsing
    fidelity_source: Any
    writer: Any
    style: PromptStyle
    judge: Any = None  # of `judge` checklist items in the committed runs


def build_parts(job: EvalJob, caller: Any, simulator_backend: Any, style: PromptStyle | None = None) -> EvalParts:
    style = style or PromptStyle()
    gen = GenerationSettings(caller_max_new_tokens=job.max_new_tokens, simulator_max_new_tokens=job.sim_max_new_tokens,
                             temperature=job.temperature, max_batch=job.max_batch, style=style,
                             max_prompt_tokens=2048)  # the eval's cap since it has had one (a train run's: its own)
    commit_actor = make_actor(caller, gen, job.seed)
    rehearsal_actor = PolicyActor(backend=caller, style=style, max_new_tokens=job.max_new_tokens,
                                  max_prompt_tokens=gen.max_prompt_tokens, temperature=job.rehearsal_temperature,
                                  seed=job.seed + 1)
    recorded = job.examples_as_recorded is not False
    simulator = ModelSource(backend=simulator_backend, name="rehearsal", record_samples=False, style=style,
                            max_new_tokens=job.sim_max_new_tokens, temperature=job.rehearsal_temperature,
                            seed=job.seed + 104729, examples_as_recorded=recorded)
    fidelity = ModelSource(backend=simulator_backend, name="rehearsal", record_samples=False, style=style,
                           max_new_tokens=job.fidelity_max_new_tokens, temperature=0.0, examples_as_recorded=recorded)
    writer = make_memory_writer(job.memory, caller, max_new_tokens=job.summary_max_new_tokens,
                                max_chars=job.memory_max_chars)
    judge = None
    if job.judge_model:
        judge = ModelJudge(caller if job.judge_model == job.model else load_backend(job.judge_model, job.max_batch))
    return EvalParts(commit_actor, rehearsal_actor, simulator, fidelity, writer, style, judge)


def run_testtime_part(job: EvalJob, tasks: list[Task], parts: EvalParts, run: RunDir, log=print) -> list:
    if job.sweep:
        results, rsets = budget_sweep(tasks, parts.rehearsal_actor, parts.commit_actor, parts.simulator,
                                      job.budgets, tuple(job.modes), parts.writer, job.max_turns, log,
                                      world=job.real_world, judge=parts.judge)
    else:
        budget = effective_budget(job)
        log(f"condition {job.rehearse} (budget {budget}) on {len(tasks)} tasks")
        result, rset = run_private_rehearsal(tasks, parts.rehearsal_actor, parts.commit_actor, parts.simulator,
                                             job.rehearse, budget, parts.writer, job.max_turns, log=log,
                                             world=job.real_world, judge=parts.judge)
        results, rsets = [result], ({rset.mode: rset} if rset is not None else {})
    for mode, rset in rsets.items():
        run.add_trajectories([r.to_row(mode) for rs in rset.attempts.values() for r in rs], name="rehearsals.jsonl")
    rows = [o.to_row() for res in results for o in res.outcomes]
    run.add_trajectories(rows, name="committed.jsonl")
    for row in condition_table(rows, seed=job.seed):
        run.log_metrics({"phase": "testtime", **row})
    bad = [r.name for r in results if r.real_calls_during_rehearsal]
    if bad:  # cannot happen by construction; counted so it would show
        raise RuntimeError(f"real tool calls during rehearsal in {bad}")
    return results


def run_gap_part(job: EvalJob, tasks: list[Task], parts: EvalParts, results: list, run: RunDir,
                 log=print) -> dict[str, float] | None:
    """The rehearsal gap of the plain real run (condition ``none``): the same caller on the same
    tasks rehearsing every response (judged as a rehearsal step judges), the rehearse role's
    fidelity on the real calls and the recorded examples, and each episode's failure class."""
    plain = next((r for r in results if r.name == "none"), None)
    if plain is None:
        log("rehearsal gap: skipped, it compares with the plain real run (budget 0), which this job did not run")
        return None
    real = [o.trajectory for o in plain.outcomes]
    sources = gap_sources(parts.simulator.backend, parts.style, job.sim_max_new_tokens, job.temperature, job.seed,
                          job.examples_as_recorded is not False, job.fidelity_max_new_tokens)
    log(f"rehearsal gap: the plain run's {len(tasks)} tasks again, rehearsal-judged, and the rehearse role's fidelity")
    gap = run_gap(tasks, real, parts.commit_actor, sources, job.max_turns, judge=parts.judge, log=log)
    metrics = {"eval/success": sum(t.solved for t in real) / len(real),
               "eval/reward": sum(t.reward for t in real) / len(real),
               **failure_metrics(tasks, real), **gap_metrics(tasks, real, gap)}
    run.add_trajectories([t.model_dump(mode="json", exclude={"samples"}, exclude_none=True) for t in gap.rehearsal],
                         name="rehearsal_judged.jsonl")
    run.add_trajectories([p.model_dump(mode="json") for p in gap.pairs], name="gap_fidelity.jsonl")
    run.add_trajectories(failure_rows(tasks, real, source="real") + failure_rows(tasks, gap.rehearsal,
                                                                                  source="rehearsal_judged"),
                         name="failures.jsonl")
    run.log_metrics({"phase": "gap", "condition": "none", **metrics})
    fid = (f"rehearsed = real for {metrics['eval/fidelity_exact']:.0%} of {metrics['eval/fidelity_n']:.0f} calls"
           if "eval/fidelity_exact" in metrics else "no real call to compare")
    log(f"rehearsal gap: real {metrics['eval/success']:.3f}, rehearsal-judged {metrics['eval/rehearsal_success']:.3f} "
        f"({metrics['eval/rehearsal_gap']:+.3f}); {fid}")
    return metrics


def fidelity_trajectories(job: EvalJob, tasks: list[Task], parts: EvalParts, log=print) -> dict[str, list]:
    out: dict[str, list] = {}
    if job.fidelity_source in ("oracle", "both"):
        missing = [t.id for t in tasks if t.reference is None]
        if missing:
            raise ValueError(f"--fidelity-source oracle needs tasks with a reference solution; {missing[0]} has none "
                             "(use --fidelity-source policy)")
        turns = max(job.max_turns, max(len(t.reference.calls) for t in tasks) + 1)
        source = RealSource(job.real_world)
        try:
            out["oracle"], _ = run_episodes(tasks, OracleActor(), source, RolloutConfig(max_turns=turns),
                                            on_turn=log_turns(log, "  fidelity, oracle episodes: ", turns))
        finally:
            source.close()
    if job.fidelity_source in ("policy", "both"):
        source = RealSource(job.real_world)
        try:
            out["policy"], _ = run_episodes(tasks, parts.commit_actor, source,
                                            RolloutConfig(max_turns=job.max_turns),
                                            on_turn=log_turns(log, "  fidelity, policy episodes: ", job.max_turns))
        finally:
            source.close()
    return out


def run_fidelity_part(job: EvalJob, tasks: list[Task], parts: EvalParts, run: RunDir, log=print) -> list:
    t0 = time.perf_counter()
    trajs = fidelity_trajectories(job, tasks, parts, log)
    cases = [c for origin, ts in trajs.items() for c in cases_from_trajectories(tasks, ts, origin)]
    if job.error_probes and "oracle" in trajs:
        cases += error_probe_cases(tasks, trajs["oracle"])
    log(f"fidelity: rehearsing {len(cases)} real tool responses (greedy) from "
        f"{sum(len(ts) for ts in trajs.values())} real trajectories")
    pairs = measure_fidelity(tasks, cases, parts.fidelity_source)
    run.add_trajectories(pairs, name="fidelity.jsonl")
    for by in (("origin", "world"), ("origin", "world", "tool")):
        for row in summarize_fidelity(pairs, by):
            run.log_metrics({"phase": "fidelity", "by": "+".join(by), **row})
    log(f"fidelity: {len(pairs)} pairs in {time.perf_counter() - t0:.0f} s")
    return pairs


def job_config(job: EvalJob, models: EvalModels, budget: int) -> dict[str, Any]:
    cfg = asdict(job)
    cfg["resolved"] = {"caller_model": models.caller, "simulator_model": models.simulator,
                       "budget": budget, "notes": models.notes,
                       "prompt_style": models.style.model_dump() if models.style else None}
    return cfg


def run_eval_job(job: EvalJob, log=print) -> RunDir:
    models = resolve_eval_models(job.model)
    if job.sim_model is not None:  # another world model rehearses for this caller
        models.simulator = resolve_eval_models(job.sim_model).simulator
        models.notes.append(f"rehearsal and fidelity by --sim-model {job.sim_model} ({models.simulator})")
    job, notes = with_run_settings(job, models.run_config)
    models.notes[:0] = notes
    budget = validate_job(job)
    tasks = eval_tasks(job, job.tasks) if job.runs_testtime else []
    fid_tasks = eval_tasks(job, job.fidelity_tasks or job.tasks) if job.fidelity else []
    for note in models.notes:
        log(note)
    apply_threads(job.threads, log)
    cap_heap_blocks(DEFAULT_MMAP_THRESHOLD)  # as a training run does
    caller = load_eval_backend(models.caller, job.max_batch, job.device, job.dtype, job.kv_reuse_tokens,
                               job.llamacpp_quant)
    sim = caller if models.shared else load_eval_backend(models.simulator, job.max_batch, job.device, job.dtype,
                                                         job.kv_reuse_tokens, job.llamacpp_quant)
    run = RunDir.create(job.out, "eval", job_config(job, models, budget), seed=job.seed, name=job.name)
    log(f"run directory: {run.path}")
    style = models.style or PromptStyle()
    if job.simulator_context is not None:
        style = style.model_copy(update={"simulator_context": job.simulator_context})
    parts = build_parts(job, caller, sim, style)
    t0 = time.perf_counter()
    if job.runs_testtime:
        results = run_testtime_part(job, tasks, parts, run, log)
        if job.rehearsal_gap:
            run_gap_part(job, tasks, parts, results, run, log)
    if job.fidelity:
        run_fidelity_part(job, fid_tasks, parts, run, log)
    path = write_eval_report(run)
    print_eval_summary(run)
    log(f"eval done in {time.perf_counter() - t0:.0f} s; report: {path}")
    return run
