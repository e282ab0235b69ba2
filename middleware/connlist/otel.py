"""connlist's OpenTelemetry instruments, by their public names (``connlist.observe.otel``)."""

from connlist.observe.otel import HOP_TIMEOUT, Instruments, MetricsMiddleware, Reading, instruments_for, read

__all__ = ["HOP_TIMEOUT", "Instruments", "MetricsMiddleware", "Reading", "instruments_for", "read"]
