"""One rollout job: tasks x G episodes against one source, written to a run directory."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial

from envace.experiments.factory import GenerationSettings, load_backend, make_actor, make_source
from envace.experiments.rundir import RunDir
from envace.experiments.summary import print_summary, summarize, summary_markdown
from envace.experiments.tasks import select_tasks
from envace.policy.threads import apply_threads
from envace.rollout.engine import RolloutConfig, run_episodes
from envace.rollout.stats import log_turns


@dataclass
class RolloutJob:
    world: str | None = None  # embedded world(s); with task_file: the real environment spec
    task_file: str | None = None
    trust_task_worlds: bool = False  # the task file's own env.world entries may run code (docs/tasks.md)
    split: str | None = None
    tasks: int = 4
    source: str = "real"
    model: str = "smollm2"
    sim_model: str | None = None
    group_size: int = 1
    max_turns: int = 4
    max_new_tokens: int = 96
    temperature: float = 0.0
    max_batch: int = 16
    seed: int = 0
    out: str = "runs"
    threads: int | None = None  # torch CPU threads (None: one per idle core)


def run_rollout_job(job: RolloutJob) -> RunDir:
    if job.tasks < 1 or job.group_size < 1 or job.max_turns < 1:
        raise ValueError("--tasks, --group-size and --max-turns must be >= 1")
    split = job.split or ("all" if job.task_file else "test")
    real_world = job.world if job.task_file else None
    tasks = select_tasks(None if job.task_file else (job.world or "shop"), split, job.tasks, job.task_file,
                         real_world=real_world, trust_task_worlds=job.trust_task_worlds)
    say = partial(print, flush=True)
    apply_threads(job.threads, say)
    run = RunDir.create(job.out, "rollout", asdict(job), seed=job.seed)
    print(f"run directory: {run.path}")
    gen = GenerationSettings(caller_max_new_tokens=job.max_new_tokens, simulator_max_new_tokens=job.max_new_tokens,
                             temperature=job.temperature, max_batch=job.max_batch,
                             max_prompt_tokens=2048)  # this job's cap since it has had one (a train run's: its own)
    policy = load_backend(job.model, job.max_batch)
    simulator = None
    if job.source == "simulator":
        simulator = load_backend(job.sim_model or job.model, job.max_batch)
    source = make_source(job.source, policy, gen, job.seed, simulator=simulator, world=real_world)
    try:
        trajs, stats = run_episodes(tasks, make_actor(policy, gen, job.seed), source,
                                    RolloutConfig(group_size=job.group_size, max_turns=job.max_turns),
                                    on_turn=log_turns(say, max_turns=job.max_turns))
    finally:
        close = getattr(source, "close", None)
        if callable(close):
            close()
    run.add_trajectories(trajs)
    summary = summarize(trajs, stats.tokens_per_second)
    run.write_text("summary.md", summary_markdown(summary, f"rollout: {job.model} on {job.task_file or job.world} ({job.source})"))
    print_summary(summary, f"{job.model} on {job.task_file or job.world}/{split}, source={job.source}")
    return run
