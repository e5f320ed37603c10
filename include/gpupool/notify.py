"""What an operator is mailed when a pipeline run fails or a handover fails or is rolled back.

The DAGs' ``on_failure_callback`` hands the mail to the SMTP provider's notifier (Airflow's own
notifier mechanism); this module only decides whether to mail and what the mail says, so it is
tested without Airflow. The message names, for each handover that ended badly, its node, its
source and target platforms, why it ended, what was undone (gpupool's hold lifted at the
source, the node sent back by a reverse handover, or nothing yet) and the commands
``action_audit`` recorded for it.

Off unless platforms.yaml names recipients (``notify.to``). A handover that stays failed over
several passes is mailed once, when it failed: later passes that fail on it again mail nothing
(the task still fails and ``GpupoolHandoverFailed`` keeps firing).
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Engine

from gpupool.actuation import handover as ho
from gpupool.config import NotifyConfig
from gpupool.values import utc_datetime

#: handover states a mail reports
ENDED_BADLY = (ho.FAILED, ho.ROLLED_BACK)


@dataclass(frozen=True)
class Notice:
    """One mail: a subject line and a plain-text body."""

    subject: str
    text: str

    def html(self) -> str:
        """The body as HTML for the notifier. Braces become entities: the notifier renders its
        fields as Jinja templates, and a command's JSON must not be read as one."""
        body = html.escape(self.text).replace("{", "&#123;").replace("}", "&#125;")
        return f'<pre style="font-family: monospace">{body}</pre>'

    def notifier_kwargs(self, config: NotifyConfig) -> dict[str, Any]:
        """Keyword arguments of ``airflow.providers.smtp.notifications.smtp.SmtpNotifier``."""
        return {"to": list(config.to), "from_email": config.from_email, "smtp_conn_id": config.smtp_conn_id,
                "subject": self.subject.replace("{", "(").replace("}", ")"), "html_content": self.html()}


@dataclass(frozen=True)
class HandoverCase:
    """A handover that ended badly, with what staging says about it: its row, its audit rows
    in the order written, and the reverse handover that sends its node back (if any)."""

    handover: ho.Handover
    audit: tuple[dict[str, Any], ...]
    reverse: ho.Handover | None = None


# ------------------------------------------------------------------------------ pure


def undone(case: HandoverCase) -> str:
    """One sentence: what gpupool undid of the handover (or that nothing is undone yet)."""
    h, real = case.handover, [a for a in case.audit if not a.get("dry_run")]
    if h.state == ho.FAILED:
        return (f"nothing undone yet: the node may still be held by gpupool; "
                f"`gpupool rollback {h.id}` undoes it")
    if case.reverse is not None:
        r = case.reverse
        return (f"the node is sent back from {h.to_platform} to {h.from_platform} by reverse handover "
                f"#{r.id} (now {r.state})")
    at_source = [a for a in real if a["platform"] == h.from_platform]
    if not real:
        return "nothing had been sent to either platform; the handover was closed"
    if any(a["platform"] == h.to_platform for a in real):
        return f"commands had reached {h.to_platform}; see the commands below"
    lifted = "gpupool's hold" in (h.error or "") and "lifted" in (h.error or "")
    cmds = ", ".join(f"{a['action']} ({a['status']})" for a in at_source)
    if lifted:
        return f"gpupool's hold at {h.from_platform} lifted, the node stays on {h.from_platform} (sent: {cmds})"
    return f"nothing of gpupool's was held at {h.from_platform}; the node stays there (sent: {cmds})"


def _when(value: Any) -> str:
    return "" if value is None else utc_datetime(value).strftime("%Y-%m-%d %H:%M:%SZ")


def handover_lines(case: HandoverCase) -> list[str]:
    """The lines of one handover in a mail."""
    h = case.handover
    mode = "dry run" if h.dry_run else "live"
    lines = [f"Handover #{h.id} ({mode}): node {h.node}, {h.from_platform} -> {h.to_platform}: {h.state.replace('_', ' ')}",
             f"  platforms: source {h.from_platform}, target {h.to_platform}",
             f"  opened {_when(h.created_at)}, last changed {_when(h.updated_at)}"
             + (f", deadline {_when(h.deadline)}" if h.deadline else ""),
             f"  why: {h.error or 'no error recorded'}",
             f"  undone: {undone(case)}"]
    if h.reason:
        lines.insert(2, f"  reason: {h.reason}")
    if case.audit:
        lines.append("  commands (action_audit):")
        for a in case.audit:
            status = a["status"] + (": " + str(a["response"])[:200] if a["status"] == "failed" and a.get("response") else "")
            lines.append(f"    {_when(a['created_at'])}  {a['platform']:<12} {a['action']:<20} {status}")
    else:
        lines.append("  commands (action_audit): none")
    return lines


def handover_notice(cases: Iterable[HandoverCase], dag_id: str, run_id: str | None,
                    task_id: str | None = None) -> Notice | None:
    """The mail for handovers that ended badly in one run (None: there are none)."""
    cases = list(cases)
    if not cases:
        return None
    nodes = sorted({c.handover.node for c in cases})
    states = sorted({c.handover.state.replace("_", " ") for c in cases})
    pairs = sorted({f"{c.handover.from_platform} -> {c.handover.to_platform}" for c in cases})
    subject = (f"gpupool: handover {' / '.join(states)}: {', '.join(nodes)} ({', '.join(pairs)})")
    where = f"{dag_id}, run {run_id}" + (f", task {task_id}" if task_id else "")
    lines = [f"{len(cases)} handover(s) failed or were rolled back ({where}).", ""]
    for c in cases:
        lines += handover_lines(c) + [""]
    lines.append("Inspect with `gpupool handovers`; undo a failed one with `gpupool rollback ID`.")
    return Notice(subject, "\n".join(lines))


def run_failure_notice(dag_id: str, run_id: str | None, reason: str | None, task_id: str | None,
                       window: tuple[datetime, datetime] | None, error: str | None,
                       cases: Iterable[HandoverCase] = ()) -> Notice:
    """The mail for a failed run: which run, window and task, the error, and the handovers
    that ended badly in its window."""
    cases = list(cases)
    lines = [f"{dag_id} run {run_id} failed" + (f": {reason}" if reason else "") + "."]
    if window is not None:
        lines.append(f"  window: [{_when(window[0])}, {_when(window[1])})")
    if task_id:
        lines.append(f"  failed task: {task_id}")
    if error:
        lines.append(f"  error: {error}")
    if cases:
        lines += ["", f"Handovers that failed or were rolled back in this window ({len(cases)}):", ""]
        for c in cases:
            lines += handover_lines(c) + [""]
    subject = f"gpupool: {dag_id} run failed" + (f" at {task_id}" if task_id else "") + (
        f" ({len(cases)} handover(s) failed or rolled back)" if cases else "")
    return Notice(subject, "\n".join(lines).rstrip() + "\n")


def newly_ended(report: Mapping[str, Any]) -> list[int]:
    """Ids of the handovers a pass (``handover.advance_all``'s report) ended badly now: failed
    or rolled back by this pass, or past its deadline without a change. One that was failed
    before the pass and still is was reported when it failed."""
    return [int(f["id"]) for f in report.get("failed", [])
            if not (f.get("before") == ho.FAILED and f.get("state") == ho.FAILED)]


# ------------------------------------------------------------------------------ staging


def read_cases(engine: Engine, ids: Iterable[int]) -> list[HandoverCase]:
    """Each handover with its audit rows and its reverse handover, read from staging."""
    cases = []
    for hid in ids:
        h = ho.get_handover(engine, hid)
        later = [x for x in ho.list_handovers(engine, node=h.node) if x.reason == f"rollback of handover #{h.id}"]
        cases.append(HandoverCase(h, tuple(ho.audit_rows(engine, h.id)), min(later, key=lambda x: x.id) if later else None))
    return cases


def ended_between(engine: Engine, start: datetime, end: datetime, limit: int = 200) -> list[int]:
    """Ids of live handovers failed or rolled back whose last change lies in [start, end],
    oldest first (of the newest ``limit``)."""
    start, end = utc_datetime(start), utc_datetime(end)
    return sorted(h.id for h in ho.list_handovers(engine, ENDED_BADLY, limit=limit)
                  if not h.dry_run and start <= h.updated_at <= end)


# ------------------------------------------------------------------------------ a callback's context


def _get(obj: Any, name: str) -> Any:
    return obj.get(name) if isinstance(obj, Mapping) else getattr(obj, name, None)


def notice_from_context(context: Mapping[str, Any], engine: Engine) -> Notice | None:
    """The mail for a failure callback's context (an Airflow task or DAG context, read
    duck-typed), or None when there is nothing to say. A ``HandoverFailed`` exception carries
    the pass's report: the handovers it ended are mailed (none new: no mail). Otherwise the run
    failed: the mail names the run, its window and failed task, and the handovers that ended
    badly in that window."""
    dag = context.get("dag")
    dag_id = _get(dag, "dag_id") or _get(context.get("dag_run"), "dag_id") or "gpupool"
    run_id = context.get("run_id") or _get(context.get("dag_run"), "run_id")
    ti = context.get("ti") or context.get("task_instance")
    task_id = _get(ti, "task_id")
    exc = context.get("exception")
    report = getattr(exc, "report", None)
    if isinstance(exc, ho.HandoverFailed) and isinstance(report, Mapping):
        return handover_notice(read_cases(engine, newly_ended(report)), dag_id, run_id, task_id)
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    window = (utc_datetime(start), utc_datetime(end)) if start is not None and end is not None else None
    cases = read_cases(engine, ended_between(engine, *window)) if window else []
    error = f"{type(exc).__name__}: {exc}" if isinstance(exc, BaseException) else None
    return run_failure_notice(dag_id, run_id, context.get("reason"), task_id, window, error, cases)


def mail_for_failure(context: Mapping[str, Any], ctx=None) -> dict[str, Any] | None:
    """``SmtpNotifier`` keyword arguments for a failure callback's context, or None: notify is
    off (platforms.yaml names no ``notify.to``) or there is nothing new to say. ``ctx`` is a
    ``pipeline.Context`` (default: loaded from the environment, as the tasks do)."""
    if ctx is None:
        from gpupool import pipeline

        ctx = pipeline.Context.load()
    if not ctx.config.notify.to:
        return None
    notice = notice_from_context(context, ctx.engine)
    return None if notice is None else notice.notifier_kwargs(ctx.config.notify)


__all__ = ["Notice", "HandoverCase", "undone", "handover_lines", "handover_notice", "run_failure_notice",
           "newly_ended", "read_cases", "ended_between", "notice_from_context", "mail_for_failure"]
