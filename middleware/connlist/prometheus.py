"""connlist's Prometheus metrics, by their public names (``connlist.observe.prometheus``)."""

from connlist.observe.prometheus import (
    DEFAULT_INTERVAL,
    PHASES,
    ConnlistMetrics,
    Exporter,
    MetricsMiddleware,
    count_phases,
    exposition_registry,
    make_metrics_app,
    mark_dead_processes,
    metrics_for,
    multiprocess_mode,
)

__all__ = [
    "DEFAULT_INTERVAL",
    "PHASES",
    "ConnlistMetrics",
    "Exporter",
    "MetricsMiddleware",
    "count_phases",
    "exposition_registry",
    "make_metrics_app",
    "mark_dead_processes",
    "metrics_for",
    "multiprocess_mode",
]
