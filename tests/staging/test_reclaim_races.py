"""Three writers on one lent node, on SQLite and the real PostgreSQL (issue 42's two-writers bar):
the owner's reclaim (a ``reclaim`` handover borrower -> owner, opened and advanced), a fast-path
move of the same node from the borrower to a third platform (opened and advanced), and a rollback
of whichever handover the node has. Each writer read the node on the borrower before it acted,
so a writer that comes after another's handover is a writer with a stale view.

Interleavings: every order of the five steps (each writer's own in its order), with the node idle
and with borrowed work on it; one step run inside another's platform call (a read or a send:
between that writer's read of the handover and its write), drawn by hypothesis; and the three
writers in threads released at once. After every step, at most one handover of the node is open
(or failed) and the node is open for work on at most one platform, on exactly one whenever no
handover of it is open; once the work ends and the open handovers are advanced, it is open on
exactly one platform, the one its records say; every command any platform received is in
``action_audit`` (``ok``) under a handover of the node, and nothing is left ``pending``.
"""

from __future__ import annotations

import itertools
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpupool.actuation import handover as ho
from gpupool.actuation.actuators.base import ActuationError

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "actuation"))
from memplatform import Interleave, make  # noqa: E402
from mempower import race  # noqa: E402

PLATFORMS = ("openstack", "slurm", "kubernetes")
OWNER, BORROWER, THIRD = "slurm", "kubernetes", "openstack"
T0 = datetime(2026, 3, 2, 12, 0, tzinfo=timezone.utc)
NEED = T0 - timedelta(minutes=10)
_FRESH = itertools.count()
STEPS = (("reclaim", "open"), ("reclaim", "advance"), ("move", "open"), ("move", "advance"), ("rollback", "run"))


def orders() -> list[tuple[tuple[str, str], ...]]:
    """Every order of :data:`STEPS` that keeps each writer's steps in their own order (30)."""
    out = set()
    for perm in itertools.permutations(STEPS):
        if perm.index(("reclaim", "open")) < perm.index(("reclaim", "advance")) and \
                perm.index(("move", "open")) < perm.index(("move", "advance")):
            out.add(perm)
    return sorted(out)


class Round:
    """One lent node (its owner slurm, held by kubernetes) and the three writers' state."""

    def __init__(self, engine, node: str, busy: bool):
        self.engine, self.node = engine, node
        self.dc, self.acts = make(PLATFORMS, {node: BORROWER})
        if busy:  # borrowed work runs on the node: a reclaim ends it (evicts), a move waits for it
            self.dc.slots[(BORROWER, node)].jobs = 1
        self.ids: dict[str, int] = {}
        self.answers: list = []

    def step(self, writer: str, what: str, at: datetime = T0):
        """Run one step; what a writer meets (a conflict, a refusal) is its answer, kept."""
        try:
            out = self._step(writer, what, at)
        except (ho.HandoverError, ActuationError) as exc:
            out = exc
        self.answers.append((writer, what, out))
        return out

    def _step(self, writer: str, what: str, at: datetime):
        e, node = self.engine, self.node
        if what == "open":
            if writer == "reclaim":
                hid = ho.open_handover(e, node, BORROWER, OWNER, at, dry_run=False, kind=ho.RECLAIM,
                                       outside_budget=True, need_since=NEED, reason="reclaim: slurm short")
            else:
                hid = ho.open_handover(e, node, BORROWER, THIRD, at, dry_run=False, reason="fast path")
            self.ids[writer] = hid
            return hid
        if what == "advance":
            if writer not in self.ids:
                return None  # its open was refused: the writer stops
            h = ho.get_handover(e, self.ids[writer])
            return ho.advance_one(e, h, self.acts, at, allow_evict=writer == "reclaim")
        # the rollback: of the node's open (or failed) handover, else of its newest live one
        hs = sorted(ho.list_handovers(e, node=node), key=lambda h: h.id)
        blocking = [h for h in hs if h.state in ho.BLOCKING_STATES]
        live = [h for h in hs if h.state != ho.ROLLED_BACK]
        target = (blocking or live or [None])[-1]
        return None if target is None else ho.rollback(e, target.id, self.acts, at=at)

    # ---- the properties
    def check_now(self) -> None:
        """At most one open (or failed) handover of the node; open on at most one platform, and
        never open on one while work of another still runs on it; with no handover open, open on
        exactly one (a node is held by gpupool only while it moves)."""
        blocking = ho.list_handovers(self.engine, ho.BLOCKING_STATES, node=self.node)
        assert len(blocking) <= 1, self.history()
        on = [p for p in PLATFORMS if self.dc.slots[(p, self.node)].schedulable or self.dc.slots[(p, self.node)].jobs]
        assert len(on) <= 1, (on, self.history())
        if not blocking:
            assert len(self.dc.open_on(self.node)) == 1, self.history()

    def settle(self, at: datetime) -> None:
        """The borrowed work ends; the open handovers are advanced (failed ones rolled back)."""
        self.dc.finish_jobs()
        for k in range(6):
            when = at + timedelta(minutes=10 * (k + 1))
            for h in ho.list_handovers(self.engine, ho.BLOCKING_STATES, node=self.node):
                if h.state == ho.FAILED:
                    ho.rollback(self.engine, h.id, self.acts, at=when)
                else:
                    ho.advance_one(self.engine, h, self.acts, when)
                self.check_now()

    def check_settled(self) -> None:
        e, node = self.engine, self.node
        assert ho.list_handovers(e, ho.BLOCKING_STATES, node=node) == [], self.history()
        # open where the records say: the newest live handover done (or sent back) is its target
        reversed_ids = {int(h.reason.rsplit("#", 1)[1]) for h in ho.list_handovers(e, node=node)
                        if (h.reason or "").startswith("rollback of handover #")}
        where = BORROWER
        for h in sorted(ho.list_handovers(e, node=node), key=lambda x: x.id):
            if h.state == ho.DONE or h.id in reversed_ids:
                where = h.to_platform
        assert self.dc.open_on(node) == [where], self.history()
        # every command a platform received is audited ok under a handover of the node, none pending
        audits = [r for r in ho.audit_rows(e) if r["node"] == node]
        ours = {h.id for h in ho.list_handovers(e, node=node)}
        assert all(r["handover_id"] in ours for r in audits)
        assert not [r for r in audits if r["status"] == "pending"], audits
        sent = sorted((c.platform, c.action) for a in self.acts.values() for c in a.sent if c.node == node)
        assert sent == sorted((r["platform"], r["action"]) for r in audits if r["status"] == "ok"), (sent, audits)
        # the reclaim is recorded as one, with its budget slot and its need
        if "reclaim" in self.ids:
            h = ho.get_handover(e, self.ids["reclaim"])
            assert (h.kind, h.outside_budget, h.need_since) == (ho.RECLAIM, True, NEED)
        for h in ho.list_handovers(e, (ho.ROLLED_BACK,), node=node):  # a rollback says why
            assert h.error, h

    def history(self) -> dict:
        return {"handovers": {h.id: (h.kind, h.from_platform, h.to_platform, h.state, h.error)
                              for h in ho.list_handovers(self.engine, node=self.node)},
                "open_on": self.dc.open_on(self.node), "answers": self.answers}


# ------------------------------------------------------------------------------------ every order


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "borrowed work"])
def test_every_order_of_a_reclaim_a_move_and_a_rollback_leaves_one_state(engine, busy):
    for k, order in enumerate(orders()):
        r = Round(engine, f"{'b' if busy else 'i'}{k:02d}", busy)
        for i, (writer, what) in enumerate(order):
            r.step(writer, what, T0 + timedelta(minutes=i))
            r.check_now()
        r.settle(T0 + timedelta(minutes=10))
        r.check_settled()


# ------------------------------------------------------------------------------------ one inside another


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(order=st.sampled_from(orders()), nested=st.integers(1, 4), at=st.integers(0, 8), busy=st.booleans())
def test_a_step_run_inside_another_writers_platform_call_leaves_one_state(engine, order, nested, at, busy):
    """Step ``nested`` of ``order`` runs inside the ``at``-th platform call of the step before it
    (between that writer's read of the handover and its write)."""
    r = Round(engine, f"x{next(_FRESH)}", busy)  # a node of its own: the engine lives across examples
    inside = Interleave(r.acts)
    steps = list(order)
    i = 0
    while i < len(steps):
        writer, what = steps[i]
        when = T0 + timedelta(minutes=i)
        if i + 1 == nested:
            inner = steps[i + 1]
            if not inside.run(lambda: r.step(writer, what, when), lambda: r.step(*inner, when), at):
                r.step(*inner, when)  # the outer step made fewer platform calls: the inner one follows it
            i += 2
        else:
            r.step(writer, what, when)
            i += 1
        r.check_now()
    r.settle(T0 + timedelta(minutes=10))
    r.check_settled()


# ------------------------------------------------------------------------------------ threads


@pytest.mark.parametrize("busy", [False, True], ids=["idle", "borrowed work"])
def test_the_three_writers_in_threads_leave_one_state(engine, busy):
    for k in range(8):
        r = Round(engine, f"t{'b' if busy else 'i'}{k}", busy)

        def work(i: int, r=r):
            if i == 2:
                return r.step("rollback", "run")
            writer = ("reclaim", "move")[i]
            r.step(writer, "open")
            return r.step(writer, "advance")

        race(3, work)
        r.check_now()
        r.settle(T0 + timedelta(minutes=10))
        r.check_settled()
