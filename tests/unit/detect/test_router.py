"""route(): each rule, its reason, and configurable thresholds and per-metric overrides."""

from __future__ import annotations

import pydantic
import pytest

from gpupool.detect.router import route
from gpupool.detect.settings import RouterConfig, RoutingRules

SEASONAL = {
    "n_valid": 2016, "constant": False, "period": 288, "period_source": "daily", "acf_period": 0.9,
    "stl_seasonal_strength": 0.9, "missing_share": 0.0, "noise_ratio": 0.2, "level_shifts": 0,
}
NOISY = {**SEASONAL, "period": None, "acf_period": None, "stl_seasonal_strength": 0.3, "noise_ratio": 1.0}
STRUCTURED = {**NOISY, "noise_ratio": 0.1, "level_shifts": 3}


def test_seasonal_goes_to_prophet_with_reason():
    name, reason = route(SEASONAL, RouterConfig())
    assert name == "prophet"
    assert "period 288" in reason


def test_noisy_goes_to_the_spiky_detector_and_structured_to_svr():
    assert route(NOISY, RouterConfig())[0] == "zscore"
    assert route(NOISY, RouterConfig(spiky_detector="sr"))[0] == "sr"
    assert route(STRUCTURED, RouterConfig())[0] == "svr"


def test_short_and_constant_histories():
    assert route({**SEASONAL, "n_valid": 20}, RouterConfig())[0] == "zscore"
    name, reason = route({**SEASONAL, "constant": True}, RouterConfig())
    assert name == "svr" and "constant" in reason
    assert route({"n_valid": 0}, RouterConfig(spiky_detector="sr"))[0] == "sr"  # an empty profile still routes


def test_prophet_needs_enough_cycles_and_few_gaps():
    assert route({**SEASONAL, "n_valid": 500}, RouterConfig())[0] != "prophet"
    assert route({**SEASONAL, "missing_share": 0.5}, RouterConfig())[0] != "prophet"


def test_thresholds_are_configuration():
    assert route(SEASONAL, RouterConfig(routing=RoutingRules(prophet_min_acf=0.95)))[0] != "prophet"
    assert route(SEASONAL, RouterConfig(routing=RoutingRules(prophet_enabled=False)))[0] != "prophet"
    assert route(STRUCTURED, RouterConfig(routing=RoutingRules(sr_min_noise_ratio=0.05)))[0] == "zscore"


def test_forced_detector_and_per_metric_override():
    assert route(SEASONAL, RouterConfig(detector="sr")) == ("sr", "forced by configuration (sr)")
    cfg = RouterConfig(overrides={"gpu_capacity": {"detector": "svr", "tau_multiplier": 8.0}})
    assert route(SEASONAL, cfg, metric="gpu_capacity")[0] == "svr"
    assert route(SEASONAL, cfg, metric="gpu_util")[0] == "prophet"
    merged = cfg.for_metric("gpu_capacity")
    assert merged.tau_multiplier == 8.0 and merged.overrides == {}


def test_config_rejects_unknown_fields_and_bad_values():
    with pytest.raises(pydantic.ValidationError):
        RouterConfig(tau_multiplier_typo=3)
    with pytest.raises(pydantic.ValidationError):
        RouterConfig(tau_multiplier=0)
    with pytest.raises(pydantic.ValidationError):
        RouterConfig(overrides={"m": {"no_such_field": 1}}).for_metric("m")


def test_a_section_in_an_override_keeps_the_bases_other_settings():
    base = RouterConfig(
        routing=RoutingRules(prophet_min_acf=0.7),
        overrides={"gpu_pending": {"routing": {"prophet_enabled": False}, "tau_multiplier": 6.0}},
    )
    merged = base.for_metric("gpu_pending")
    assert merged.routing == RoutingRules(prophet_min_acf=0.7, prophet_enabled=False)
    assert merged.tau_multiplier == 6.0 and merged.overrides == {}
    assert base.merged({"alarms": {"run_points": 0}}).alarms.run_points == 0
    assert base.merged({"alarms": {"run_points": 0}}).alarms.merge_points == RouterConfig().alarms.merge_points
    with pytest.raises(pydantic.ValidationError):
        base.merged({"alarms": {"run_points": -1}})
    # a tuned constant is no operator knob: the old flat name is refused, not silently ignored
    with pytest.raises(pydantic.ValidationError):
        RouterConfig(alarm_history_share=0.001)
