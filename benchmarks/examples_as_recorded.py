"""How far answering a recorded call as recorded (rollout.examples_as_recorded) can be trusted, on
the embedded worlds, with no model: every recorded example of each task is called in a fresh real
world (a) on the task's initial state, as a call before any write sees it, and (b) after the
task's reference solution ran (its writes done), as a repeated lookup late in an episode sees
it; each real result is compared with the recorded one (same JSON value).

    python benchmarks/examples_as_recorded.py [--tasks 100] [--split train]

Prints, per world: examples, the share equal at (a) and at (b), and for (b) what the source's
rule does (rollout/sources.py ``record_holds``: the record answers only until the episode's
first write that did not fail): the share of (b) calls it still answers from the record, how
many of those are right, and how many of the calls it hands to the model the record would
have got wrong.
"""

from __future__ import annotations

import argparse
import json

from envace.envs.registry import make_world, world_names
from envace.envs.tasks import load_tasks
from envace.rollout.sources import canonical_json, record_holds


def measure(world: str, split: str, limit: int) -> dict[str, float]:
    tasks = [t for t in load_tasks(world, split, limit=limit) if t.examples and t.reference is not None]
    n = before = after = held = held_right = closed_stale = 0
    for task in tasks:
        for ex in task.examples:
            fresh = make_world(task.env.world, task.env.seed)
            same_before = canonical_json(fresh.call(ex.tool, ex.arguments)) == canonical_json(ex.result)
            done = make_world(task.env.world, task.env.seed)
            earlier = [(call, json.dumps(done.call(call.name, call.arguments))) for call in task.reference.calls]
            same_after = canonical_json(done.call(ex.tool, ex.arguments)) == canonical_json(ex.result)
            n, before, after = n + 1, before + same_before, after + same_after
            if record_holds(task, earlier):
                held, held_right = held + 1, held_right + same_after
            else:
                closed_stale += not same_after
    nan = float("nan")
    return {"tasks": len(tasks), "examples": n, "equal_initial": before / n if n else nan,
            "equal_after_reference": after / n if n else nan, "held_after": held / n if n else nan,
            "held_right": held_right / held if held else nan, "closed": n - held, "closed_stale": closed_stale}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=100, help="tasks per world (the first of the split)")
    ap.add_argument("--split", default="train", choices=["train", "test"])
    args = ap.parse_args()
    print("| world | tasks | examples | recorded = real, initial state | recorded = real, after the reference | "
          "after: still answered from the record | of those, right | after: handed to the model | of those, "
          "record stale |")
    print("|---|---|---|---|---|---|---|---|---|")
    for world in world_names():
        m = measure(world, args.split, args.tasks)
        print(f"| {world} | {m['tasks']} | {m['examples']} | {m['equal_initial']:.3f} | "
              f"{m['equal_after_reference']:.3f} | {m['held_after']:.3f} | {m['held_right']:.3f} | {m['closed']} | "
              f"{m['closed_stale']} |")


if __name__ == "__main__":
    main()
