"""Prometheus metrics, in base units (seconds, bytes), on a registry owned by one app.

A registry per app (not the process-global default) lets tests build several apps in one
process and lets each app's /metrics show only its own numbers.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Decode latency on accelerators spans milliseconds (tiny latents) to minutes (81 frames on CPU).
_SECONDS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "vaeserve_requests", "HTTP requests answered, by route and status", ["route", "status"], registry=r
        )
        self.queue_seconds = Histogram(
            "vaeserve_queue_seconds", "Time from arrival to the start of its device batch", buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.device_seconds = Histogram(
            "vaeserve_device_seconds", "Device time per batch (the VAE decode or encode, transfers to the host "
            "included), by operation", ["operation"], buckets=_SECONDS_BUCKETS, registry=r,
        )
        self.serialize_seconds = Histogram(
            "vaeserve_serialize_seconds", "Time to write the response body (mp4, png, npy, pt, safetensors), "
            "by output_type", ["output_type"], buckets=_SECONDS_BUCKETS, registry=r,
        )
        self.total_seconds = Histogram(
            "vaeserve_request_seconds", "Decode and encode request latency, arrival to response body",
            buckets=_SECONDS_BUCKETS, registry=r,
        )
        self.batch_size = Histogram(
            "vaeserve_batch_size", "Inputs per device batch, before padding", buckets=(1, 2, 4, 8, 16, 32, 64),
            registry=r,
        )
        self.queue_depth = Gauge("vaeserve_queue_depth", "Requests waiting for the device", registry=r)
        self.uploads = Gauge("vaeserve_uploads", "Requests whose bodies are being read (they hold no queue place)",
                             registry=r)
        self.host_memory_bytes = Gauge(
            "vaeserve_host_memory_bytes", "Host bytes that requests in flight hold in the host account (decoded "
            "encode inputs, decoded frames, answers, stream buffers; at most host_memory_bytes)", registry=r)
        self.host_memory_limit = Gauge(
            "vaeserve_host_memory_limit_bytes", "The host account's size (host_memory_bytes)", registry=r)
        self.device_memory_limit = Gauge(
            "vaeserve_device_memory_limit_bytes", "Memory per device that every program is checked against before "
            "it runs (0: unknown, not checked)", registry=r)
        self.refused_for_memory = Counter(
            "vaeserve_refused_for_memory", "Requests refused because they cannot fit the memory they would run in, "
            "by the check that refused them: estimate (before compiling), compiled (memory_analysis), host (the "
            "host account)", ["check"], registry=r)
        self.batches_split = Counter(
            "vaeserve_batches_split", "Batches of several requests whose programs could not fit the memory, run "
            "again in smaller batches (no request refused for what its batch-mates made of it)", registry=r)
        self.out_of_memory = Counter(
            "vaeserve_out_of_memory", "Device calls that ran out of memory while they ran, by where: device (XLA "
            "RESOURCE_EXHAUSTED) or host (an allocation failed)", ["where"], registry=r)
        self.frames_decoded = Counter("vaeserve_frames_decoded", "Output frames decoded (excluding padding)",
                                      registry=r)
        self.frames_encoded = Counter("vaeserve_frames_encoded", "Input frames encoded (excluding padding)",
                                      registry=r)
        self.compiles = Counter(
            "vaeserve_compiles", "XLA compiles of decode, stream-step and encode programs (or loads from --compile-cache)", registry=r
        )
        self.compile_seconds = Histogram(
            "vaeserve_compile_seconds", "Time per program compile", buckets=_SECONDS_BUCKETS, registry=r
        )
        self.programs = Gauge("vaeserve_programs", "Compiled programs held in the model's cache", registry=r)
        self.evictions = Counter(
            "vaeserve_program_evictions", "Compiled programs dropped to stay within max_programs", registry=r
        )
        self.refused_shapes = Counter(
            "vaeserve_shapes_refused", "Requests refused because their shape is not served (--shapes)", registry=r
        )
        self.dropped = Counter(
            "vaeserve_dropped", "Requests dropped from the queue or from their decode at a step boundary "
            "(client-gone, deadline, slow-reader)", ["reason"], registry=r
        )
        self.ready = Gauge("vaeserve_ready", "1 once the model is loaded and warm-up shapes compiled", registry=r)
        self.encoders_busy = Gauge("vaeserve_encoders_busy", "H.264 encodes running (at most mp4_writers)",
                                   registry=r)
        self.buffered_bytes = Gauge(
            "vaeserve_stream_buffered_bytes", "Decoded frame bytes that streams and MP4 requests hold for their "
            "readers or encoders", registry=r)
