"""World-model fidelity: how well the policy's rehearsed tool responses match the real world.

For each call of a real trajectory (the scripted oracle's or the policy's own, run against the
real world), the model rehearses the response given the same history — the simulator prompt with
the same earlier calls and the real results they got — greedily, and the rehearsed response is
compared with what the real world returned:

* ``format_ok`` — the rehearsal is JSON inside ``<execution_result>`` tags; ``parsed`` — a JSON
  value can be read from it (strictly, or the first JSON value of a response that broke the tag
  format: the content metrics below use it, so format and content are measured apart);
* ``exact`` — the same JSON value (``1`` and ``1.0`` equal; ``true`` and ``1`` not);
* ``structure`` — the same key sets, recursively (list elements compared by shape; an empty list
  matches any list; scalar types are not compared);
* ``value`` — the fields that matter (:mod:`envace.testtime.fields`: ids, amounts, counts,
  status) are the same multiset of (path, value); undefined (None) when the real response has
  none. ``fields_matched / fields_total`` is the per-field accuracy;
* ``error_agree`` — both are errors or both are not; ``code_match`` — same error code when both
  are errors.

*Example cases* (origin ``example``) rehearse each of a task's recorded examples with no history
and compare with its recorded result: can the rehearse role answer a recorded call as recorded
(the prompt shows the example)? Each pair also says whether the call matched a recorded example
(``as_recorded``: the source answered it from the example) and, for calls of real trajectories,
whether the recorded result equals what the real world returned (``recorded_exact``: how far
answering recorded calls as recorded can be trusted).

*Error probes* add calls the real world rejects: an id argument of a real call replaced by an id
that does not exist, with the real response taken from a fresh world replayed to that point; the
oracle never errs, so without probes the error metric only sees successes.
"""

from __future__ import annotations

from envace.core import safejson

import json
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, Field

from envace.core.errors import error_code, is_error
from envace.core.types import Task, ToolCall, Trajectory, trajectory_calls
from envace.core.validate import validate_call
from envace.envs.probes import error_probes
from envace.rollout.sources import ResponseSource, ToolRequest, dump_result, example_for
from envace.testtime.fields import important_fields


def _load(text: str) -> tuple[bool, Any]:
    if not isinstance(text, str):
        return False, None
    value, why = safejson.loads(text)
    return why is None, value


def first_json(text: str) -> tuple[bool, Any]:
    """The JSON value that starts at the first ``{`` or ``[`` of ``text`` (what a model that
    skipped or mangled the result tags still meant), or (False, None)."""
    ok, value = _load(text)
    if ok:
        return ok, value
    starts = [i for i in (text.find("{"), text.find("[")) if i >= 0]
    if not starts:
        return False, None
    try:
        value, _ = json.JSONDecoder().raw_decode(text, min(starts))
    except json.JSONDecodeError:
        return False, None
    return True, value


def json_equal(a: Any, b: Any) -> bool:
    """JSON value equality: numbers by value, but booleans are not numbers."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(json_equal(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def same_structure(a: Any, b: Any) -> bool:
    """Same key sets recursively; lists: every element of each has the shape of the other's first."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_structure(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        if not a or not b:
            return True
        return all(same_structure(x, b[0]) for x in a) and all(same_structure(y, a[0]) for y in b)
    return not isinstance(a, (dict, list)) and not isinstance(b, (dict, list))


class ResponseMatch(BaseModel):
    format_ok: bool  # strict: JSON inside <execution_result> tags, as the rollout engine parses it
    parsed: bool = True  # a JSON value could be read (strictly, or leniently: see compare_responses)
    exact: bool
    structure: bool
    value: bool | None = None  # None: the real response has no field that matters
    fields_total: int
    fields_matched: int
    real_error: bool
    rehearsed_error: bool
    error_agree: bool
    code_match: bool | None = None  # None unless both are errors


def compare_responses(real: Any, rehearsed_text: str, format_ok: bool = True, lenient: bool = True
                      ) -> ResponseMatch:
    """Compare the real response (a JSON value) with a rehearsed one (its text).

    ``format_ok`` says whether the rehearsal kept the strict format. With ``lenient`` the content
    metrics still read the first JSON value of a rehearsal that broke the format (an untrained
    model often writes the right JSON in the wrong tags), so format and content are measured
    apart; without it, a format failure fails every metric.
    """
    if format_ok:
        ok, value = _load(rehearsed_text)
    else:
        ok, value = first_json(rehearsed_text) if lenient else (False, None)
    real_fields = important_fields(real)
    total = sum(real_fields.values())
    real_err = is_error(real)
    if not ok:
        return ResponseMatch(format_ok=False, parsed=False, exact=False, structure=False,
                             value=False if total else None,
                             fields_total=total, fields_matched=0, real_error=real_err, rehearsed_error=False,
                             error_agree=False, code_match=None)
    reh_fields = important_fields(value)
    reh_err = is_error(value)
    return ResponseMatch(
        format_ok=format_ok, parsed=True, exact=json_equal(real, value), structure=same_structure(real, value),
        value=(real_fields == reh_fields) if total else None, fields_total=total,
        fields_matched=sum((real_fields & reh_fields).values()), real_error=real_err, rehearsed_error=reh_err,
        error_agree=real_err == reh_err,
        code_match=(error_code(real) == error_code(value)) if real_err and reh_err else None)


class FidelityCase(BaseModel):
    """One real call to rehearse: the task, the call, the history before it, the real answer."""

    task_id: str
    world: str
    origin: str  # "oracle" | "policy" | "probe"
    trajectory_index: int = 0
    position: int  # index of the call in its trajectory
    call: ToolCall
    earlier: list[tuple[ToolCall, str]] = Field(default_factory=list)
    real_text: str


class FidelityPair(BaseModel):
    """A case with its rehearsed response and the comparison."""

    task_id: str
    world: str
    tool: str
    origin: str
    position: int
    arguments: dict[str, Any]
    real: str
    rehearsed: str
    gen_tokens: int = 0
    match: ResponseMatch
    as_recorded: bool = False  # the source answered from a recorded example of this call
    recorded_exact: bool | None = None  # the call matches an example: its recorded result equals the real one


def _world_of(task: Task) -> str:
    return (task.env.world if task.env is not None else None) or task.domain or "?"


def cases_from_trajectories(tasks: list[Task], trajectories: Iterable[Trajectory], origin: str) -> list[FidelityCase]:
    """Every call of real trajectories that reached the world (calls the engine rejected as
    malformed or schema-invalid never reach any source, so there is nothing to rehearse)."""
    by_id = {t.id: t for t in tasks}
    out: list[FidelityCase] = []
    for traj in trajectories:
        if traj.source != "real":
            raise ValueError(f"fidelity needs real trajectories; {traj.task_id} came from {traj.source!r}")
        task = by_id.get(traj.task_id)
        if task is None:
            raise ValueError(f"trajectory of unknown task {traj.task_id}")
        earlier: list[tuple[ToolCall, str]] = []
        for i, (call, answer) in enumerate(trajectory_calls(traj)):
            if validate_call(call, task.tools) is None:
                out.append(FidelityCase(task_id=task.id, world=_world_of(task), origin=origin,
                                        trajectory_index=traj.trajectory_index, position=i, call=call,
                                        earlier=list(earlier), real_text=answer.content))
            earlier.append((call, answer.content))
    return out


def example_cases(tasks: list[Task]) -> list[FidelityCase]:
    """Each recorded example of ``tasks`` as a call to rehearse with no history, its recorded result
    as the answer (origin ``example``). Rehearse them with a source that does not answer recorded
    calls as recorded (``examples_as_recorded=False``), or every pair is exact by construction."""
    return [FidelityCase(task_id=t.id, world=_world_of(t), origin="example", position=i,
                         call=ToolCall(name=ex.tool, arguments=ex.arguments), real_text=dump_result(ex.result))
            for t in tasks for i, ex in enumerate(t.examples)]


def error_probe_cases(tasks: list[Task], trajectories: Iterable[Trajectory], max_per_trajectory: int = 1
                      ) -> list[FidelityCase]:
    """Calls of real trajectories with one id argument replaced by an id that does not exist
    (``envace.envs.probes``, obvious ids): the real response comes from a fresh world of the task
    replayed through the earlier calls, so the probe is answered exactly as the real world would."""
    by_id = {t.id: t for t in tasks}
    out: list[FidelityCase] = []
    for traj in trajectories:
        task = by_id[traj.task_id]
        pairs = trajectory_calls(traj)
        for p in error_probes(task, [c for c, _ in pairs], max_per_trajectory):
            out.append(FidelityCase(task_id=task.id, world=_world_of(task), origin="probe",
                                    trajectory_index=traj.trajectory_index, position=p.position, call=p.call,
                                    earlier=[(c, a.content) for c, a in pairs[:p.position]],
                                    real_text=json.dumps(p.result, ensure_ascii=False)))
    return out


def measure_fidelity(tasks: list[Task], cases: list[FidelityCase], simulator: ResponseSource) -> list[FidelityPair]:
    """Rehearse every case with ``simulator`` (one batched call) and compare with the real answer.

    ``simulator`` should decode greedily (e.g. ``ModelSource(backend, temperature=0.0,
    record_samples=False)``) so that the figures are reproducible.
    """
    if not cases:
        return []
    by_id = {t.id: t for t in tasks}
    requests = [ToolRequest(task=by_id[c.task_id], call=c.call, earlier=list(c.earlier), state=None,
                            trajectory_index=c.trajectory_index, turn=c.position) for c in cases]
    responses = simulator.respond(requests)
    out = []
    for c, r in zip(cases, responses):
        _, real = _load(c.real_text)
        example = example_for(by_id[c.task_id], c.call) if c.origin != "example" else None
        out.append(FidelityPair(task_id=c.task_id, world=c.world, tool=c.call.name, origin=c.origin,
                                position=c.position, arguments=c.call.arguments, real=c.real_text,
                                rehearsed=r.text, gen_tokens=int(r.extra.get("gen_tokens", 0)),
                                match=compare_responses(real, r.text, r.format_ok),
                                as_recorded=bool(r.extra.get("as_recorded")),
                                recorded_exact=None if example is None else json_equal(real, example.result)))
    return out


METRICS = ("format_ok", "parsed", "exact", "structure", "value", "error_agree")


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def summarize_fidelity(pairs: Iterable[FidelityPair | dict[str, Any]], by: tuple[str, ...] = ("world",)
                       ) -> list[dict[str, Any]]:
    """One row per group (keys of ``by`` among world, tool, origin): rates of every metric."""
    groups: dict[tuple, list[FidelityPair]] = {}
    for p in pairs:
        p = p if isinstance(p, FidelityPair) else FidelityPair.model_validate(p)
        groups.setdefault(tuple(getattr(p, k) for k in by), []).append(p)
    rows = []
    for key in sorted(groups):
        ps = groups[key]
        ms = [p.match for p in ps]
        valued = [m.value for m in ms if m.value is not None]
        codes = [m.code_match for m in ms if m.code_match is not None]
        total = sum(m.fields_total for m in ms)
        row: dict[str, Any] = dict(zip(by, key))
        row.update({
            "n": len(ps),
            "format_ok": _mean([m.format_ok for m in ms]),
            "parsed": _mean([m.parsed for m in ms]),
            "exact": _mean([m.exact for m in ms]),
            "structure": _mean([m.structure for m in ms]),
            "value": _mean(valued), "value_n": len(valued),
            "field_accuracy": sum(m.fields_matched for m in ms) / total if total else None,
            "error_agree": _mean([m.error_agree for m in ms]),
            "code_match": _mean(codes), "real_errors": sum(m.real_error for m in ms),
            "rehearsed_errors": sum(m.rehearsed_error for m in ms),
            "as_recorded": _mean([p.as_recorded for p in ps]),
            "recorded_exact": _mean([p.recorded_exact for p in ps if p.recorded_exact is not None]),
            "recorded_n": sum(p.recorded_exact is not None for p in ps),
        })
        rows.append(row)
    return rows
