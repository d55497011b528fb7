"""A stand-in for what the dashboard reads of a session: up, version 1 of every live code kind, 2 steps."""

from types import SimpleNamespace

from forge_nb.metrics import MetricsStream


def dashboard_session(**extra) -> SimpleNamespace:
    live = SimpleNamespace(version=1)
    return SimpleNamespace(
        metrics_stream=MetricsStream(),
        is_up=True,
        background=None,
        trainer_version=2,
        generator_version=2,
        step_count=2,
        registry=SimpleNamespace(live=lambda kind: live, records=[]),
        **extra,
    )
