"""A multi-host slice: one process per host, process 0 serving HTTP and sending every device call to all
(``member``), the wire format of those calls (``broadcast``), the control plane, liveness and stop
(``control``), and how the service joins one (``boot``, the only part the HTTP layer imports)."""
