"""The cleaning rules, one module each: what looks like an exporter fault is replaced, everything
else the series does is kept.

- `spikes`: a short excursion that towers over the series' own and jumps back;
- `faults`: falls towards zero that come back (drops, collapses) and counter resets;
- `stuck`: one exact value repeated for longer than the history makes plausible;
- `outages`: on a series that hardly idles, a long fall to zero is the exporter's;
- `gaps`: the line that bridges a cleaned run or a short gap.

`gpupool.detect.clean` applies them in order to each flagged point.

Their settings are `gpupool.detect.settings.CleaningRules` (`RouterConfig.cleaning`); the rest
are constants beside each rule.
"""
