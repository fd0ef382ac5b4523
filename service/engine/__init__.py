"""The engine: one device thread, a bounded queue, the device runner and the start-up.

Host side (no JAX at import; the HTTP layer uses it): ``worker`` (the queue and the device
thread), ``jobs`` (a request as the engine sees it), ``model`` (what start-up produced, and the
seams a multi-host slice plugs into), ``limits``, ``errors`` (the engine's own error types, mapped
to HTTP by ``service.http``) and ``boot`` (the one door to the device side).
Device side (JAX): ``runner`` (every device call) and ``startup`` (load, mesh, warm-up).
"""
