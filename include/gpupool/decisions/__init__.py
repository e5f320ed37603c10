"""The pure decisions of the plan and the fast path: numbers in, decisions out.

``demand`` (each platform's demand the plan plans on: one :func:`~gpupool.decisions.demand.plan_demand`
for production and the what-if), ``planner`` (which platform holds each pool node), ``layouts``
(nodes and their MIG layouts), ``policy`` (the planner's knobs), ``fastpath`` (the fast path's
:func:`~gpupool.decisions.fastpath.decide` and its bounds), ``parking`` (which idle nodes park,
which parked nodes wake) and ``cadence`` (the fast path's cadence).

Nothing here reads or writes: no staging, no sources, no detect, no actuation, no Airflow
(``tests/unit/core/test_imports.py``). The jobs that read their inputs and act on their answers
are :mod:`gpupool.jobs`; the what-if (:mod:`gpupool.sim`) calls the same functions on its world.
"""
