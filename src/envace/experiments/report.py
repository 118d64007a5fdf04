"""Reports of a run directory: a PNG learning curve and a markdown summary."""

from __future__ import annotations

import textwrap
from pathlib import Path

from envace.core.jsonl import read_jsonl_dicts
from envace.core.types import solved
from envace.envs.registry import spec_label
from envace.experiments.rundir import RunDir
from envace.experiments.stats import paired_gain


_EVAL_SETS = {"test": "held-out tasks", "pool": "the trained tasks (GRPO pool)", "train": "train-split tasks"}


def eval_set(cfg: dict) -> str:
    """What a run's real-world eval measured (``cfg``: its config.yaml), in words: with
    ``eval.split: pool`` the tasks GRPO trains on, which must not pass for held-out ones; and
    greedy or sampled (``eval.samples`` at ``eval.temperature``), whose figures differ."""
    ev = cfg.get("eval") or {}
    split, samples, temperature = ev.get("split", "test"), ev.get("samples") or 1, ev.get("temperature") or 0.0
    how = "greedy" if temperature == 0 else f"{samples} episode{'s' if samples > 1 else ''} each at T={temperature:g}"
    return f"{_EVAL_SETS.get(split, f'{split} tasks')}, {how}"


def eval_task_success(run: RunDir) -> dict[int, dict[str, float]]:
    """Eval step -> task id -> mean success of that task's real-world eval episodes (evals.jsonl)."""
    path = run.path / "evals.jsonl"
    hits: dict[int, dict[str, list[float]]] = {}
    if path.is_file():
        for row in read_jsonl_dicts(path):
            hits.setdefault(row["step"], {}).setdefault(row["task_id"], []).append(float(solved(row["reward"])))
    return {step: {t: sum(v) / len(v) for t, v in tasks.items()} for step, tasks in hits.items()}


def eval_steps(run: RunDir, by_step: dict[int, dict[str, float]], first: int | None = None,
               last: int | None = None) -> tuple[int, int]:
    """The two eval steps to compare (default: the run's first and last), checked against
    ``by_step`` (its :func:`eval_task_success`); ValueError naming the run when it lacks one."""
    first = min(by_step, default=None) if first is None else first
    last = max(by_step, default=None) if last is None else last
    for step in (first, last):
        if step not in by_step:
            raise ValueError(f"{run.path}: no real-world eval at step {step} in evals.jsonl (have {sorted(by_step)})")
    return first, last


def run_labels(runs: list[RunDir]) -> dict[str, RunDir]:
    """Legend labels for a comparison: each run's source, with its seed where the runs' seeds
    differ, and its directory name only where that still leaves two runs the same."""
    cfgs = [r.config() for r in runs]
    seeds = len({c.get("seed") for c in cfgs}) > 1
    labels = [f"{c.get('source', '?')}" + (f", seed {c.get('seed')}" if seeds else "") for c in cfgs]
    return {(f"{lab} ({r.path.name})" if labels.count(lab) > 1 else lab): r for lab, r in zip(labels, runs)}


def plot_learning_curve(runs: dict[str, RunDir], path: Path, title: str = "real-world success") -> Path:
    """Eval success vs step for one or more runs (one line each), train reward dashed."""
    import matplotlib

    matplotlib.use("Agg")  # no screen on these machines
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, run in runs.items():
        rows = run.metrics()
        ev = [r for r in rows if r.get("phase") == "eval"]
        tr = [r for r in rows if r.get("phase") == "train"]
        if ev:
            line, = ax1.plot([r["step"] for r in ev], [r["eval/success"] for r in ev], marker="o",
                             label=f"{label} success")
            # the checklist fraction moves before full success does: the earlier sign of learning
            ax1.plot([r["step"] for r in ev], [r.get("eval/reward", float("nan")) for r in ev], ":", marker=".",
                     color=line.get_color(), label=f"{label} reward")
        if tr:
            for role, style in (("caller", "-"), ("simulator", "--")):
                pts = [(r["step"], r[f"reward/{role}"]) for r in tr if f"reward/{role}" in r]
                if pts:
                    ax2.plot(*zip(*pts), style, label=f"{label} {role}")
    sets = sorted({eval_set(run.config()) for run in runs.values()})
    # what was measured goes under the title: as the y label it ran off the figure
    ax1.set_xlabel("step"), ax1.set_ylabel("success / reward in the real worlds")
    ax1.set_title(title + "\n" + textwrap.fill(" / ".join(sets), 60), fontsize=9)
    ax2.set_xlabel("step"), ax2.set_ylabel("mean training reward"), ax2.set_title("training reward per role")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


def write_train_report(run: RunDir) -> Path:
    rows = run.metrics()
    cfg = run.config()
    ev = [r for r in rows if r.get("phase") == "eval"]
    tr = [r for r in rows if r.get("phase") == "train"]
    sft = [r for r in rows if r.get("phase") == "sft"]
    plot_learning_curve({cfg.get("source", "run"): run}, run.path / "learning_curve.png")
    lines = [f"# Training run `{run.path.name}`", "",
             f"model `{cfg.get('model')}`, source `{cfg.get('source')}`, mode `{cfg.get('mode')}`, "
             f"{cfg.get('steps')} steps x {cfg.get('tasks_per_step')} tasks x G={cfg.get('group_size')}, "
             + (f"tasks `{cfg.get('task_file')}`, real world `{spec_label(cfg.get('world'))}`" if cfg.get("task_file")
              else f"worlds {cfg.get('worlds')}") + f", seed {cfg.get('seed')}", ""]
    if sft:
        s = sft[-1]
        lines.append(f"SFT warm start: {s['sft/samples']} samples, loss {s['sft/first_loss']:.3f} -> "
                     f"{s['sft/last_loss']:.3f} in {s['sft/seconds']:.0f} s")
        lines.append("")
    if ev:
        if ev[-1].get("eval_kind") == "rehearsal":
            lines += ["## Rehearsal-judged evaluation (no real environment)", "",
                      "No real environment was given, so the policy answered its own tool calls and success counts "
                      "only what a trajectory shows (called / answer_contains / judge items). It is not real-world "
                      f"success ({eval_set(cfg)}).", ""]
        else:
            lines += [f"## Real-world evaluation ({eval_set(cfg)})", ""]
        lines += [
                  "| step | success | tasks solved (any episode) | mean reward | tool calls | parse failures |",
                  "|---|---|---|---|---|---|"]
        # a row of an older run (before eval.samples) or a partial one lacks columns: nan, not a crash
        nan = float("nan")
        lines += [f"| {r['step']} | {r.get('eval/success', nan):.3f} | {r.get('eval/tasks_solved', nan):.3f} | "
                  f"{r.get('eval/reward', nan):.3f} | {r.get('eval/tool_calls', nan):.2f} | "
                  f"{r.get('eval/parse_failures', nan):.2f} |" for r in ev]
        lines.append("")
        if len(ev) > 1 and (run.path / "evals.jsonl").is_file():
            by_step = eval_task_success(run)
            first, last = eval_steps(run, by_step)
            gain, se, n = paired_gain(by_step[first], by_step[last])
            lines += [f"Success gain from step {first} to step {last}: **{gain:+.3f}** (paired standard error "
                      f"{se:.3f} over {n} tasks; under about two standard errors a gain may be noise).", ""]
    if tr:
        secs = sum(r["step_s"] for r in tr)
        lines += ["## Training", "", f"{len(tr)} steps in {secs:.0f} s "
                  f"({secs / len(tr):.1f} s/step; rollout {sum(r['rollout_s'] for r in tr) / len(tr):.1f} s, "
                  f"update {sum(r['update_s'] for r in tr) / len(tr):.1f} s)", "",
                  "| step | reward | success | caller R | simulator R | tool calls | sim format failures |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {r['step']} | {r['reward']:.3f} | {r['success']:.3f} | {r.get('reward/caller', float('nan')):.3f} | "
                  f"{r.get('reward/simulator', float('nan')):.3f} | {r['tool_calls']:.2f} | {r['sim_format_failures']:.2f} |"
                  for r in tr]
    lines += ["", "![learning curve](learning_curve.png)", ""]
    return run.write_text("summary.md", "\n".join(lines))


def write_report(run: RunDir) -> Path:
    """The report a run's kind calls for."""
    kind = run.meta().get("kind")
    if kind == "train":
        return write_train_report(run)
    if kind == "eval":
        from envace.experiments.eval_report import write_eval_report

        return write_eval_report(run)
    from envace.experiments.summary import summarize, summary_markdown

    return run.write_text("summary.md", summary_markdown(summarize(run.trajectories()), f"{kind} run {run.path.name}"))


def missing_parts(run: RunDir) -> list[str]:
    """What a run directory does not hold yet, in words (a report of a run that has just started,
    or crashed in its warm start, draws empty plots: say why)."""
    kind = run.meta().get("kind")
    out = []
    if kind == "train":
        rows = run.metrics()
        if not any(r.get("phase") == "train" for r in rows):
            sft = (run.path / "sft").is_dir()
            out.append("no training step logged yet: " + ("the SFT warm start is there, RL has not logged a step"
                                                          if sft else "the run is still in its warm start, or "
                                                          "stopped before its first step") +
                       f" (envace train --resume {run.path} continues it)")
        if not any(r.get("phase") == "eval" for r in rows):
            out.append("no eval yet: the learning curve has no success line (eval.every, or the run's end)")
        if not (run.path / "checkpoints").is_dir():
            out.append("no checkpoint yet")
    elif kind == "eval" and not (run.path / "committed.jsonl").is_file() and not (run.path / "fidelity.jsonl").is_file():
        out.append("no committed or fidelity rows yet: the eval has not finished a condition")
    elif kind not in ("train", "eval") and not run.trajectories():
        out.append("no trajectories yet")
    return out
