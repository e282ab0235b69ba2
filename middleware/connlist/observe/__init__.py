"""What observes the list: the debug endpoint and its page, the workers' view, Prometheus, OpenTelemetry.

Observers read the list (``connlist.core``) and what the servers say of
the integration; they change nothing the servers or the timeouts depend on.
"""
