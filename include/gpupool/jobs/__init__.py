"""The jobs that read and write, beside :mod:`gpupool.pipeline`: they read staging and the
platforms, call the pure decisions (:mod:`gpupool.decisions`) and act through
:mod:`gpupool.actuation`.

``allocation`` (the hourly plan-and-act: plan from staging, actuate a stored plan, advance and
roll back handovers), ``fastpath`` (one fast-path tick: read, stage, judge, park and wake,
decide, open), ``power`` (the power step both run: the parking rule on staging's inputs, parks
and wakes through the power machine; ``gpupool power``), ``pressure`` (each platform's pressure
read now), ``owners`` (who owns each pool node, recorded once in staging; ``gpupool owners``)
and ``text`` (what the CLI prints of them).
"""
