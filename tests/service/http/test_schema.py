"""Schema-driven fuzzing (schemathesis) of the declared API against a real server: every
operation, bodies in every declared media type, valid and invalid data, a bounded number of
examples. No answer may be a 5xx, and every answer must match the OpenAPI document (status code,
media type, body schema)."""

from __future__ import annotations

import hypothesis
import pytest
import schemathesis
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

from tests.helpers.service_helpers import thread_server

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
EXAMPLES = 30  # per operation and mode: a few seconds in all on 2 cores

# The latent, frame, image and video formats are opaque bytes, as application/octet-stream is.
for media_type in ("tensor/binary", "application/x-npy", "application/x-safetensors", "image/png", "image/jpeg",
                   "video/mp4"):
    schemathesis.serializer.alias(media_type, "application/octet-stream")


@pytest.fixture(scope="module")
def fuzz_server(tiny_vae):
    with thread_server(tiny_vae, read_timeout_s=5) as srv:
        yield srv


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=lambda m: m.value)
def test_declared_api_has_no_5xx_and_no_schema_violations(fuzz_server, mode):
    schema = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    bodies = {"POST /v1/decode", "POST /v1/encode"}
    assert {op.label for op in operations} >= {*bodies, "GET /v1/models", "GET /metrics"}
    refused0 = {route: fuzz_server.metric("vaeserve_requests_total", route=route, status="422")
                for route in ("/v1/decode", "/v1/encode")}
    if mode is GenerationMode.NEGATIVE:  # the operations whose inputs can be made invalid
        operations = [op for op in operations if op.label in bodies]
    for operation in operations:
        @hypothesis.given(case=operation.as_strategy(generation_mode=mode))
        @hypothesis.settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                             phases=[hypothesis.Phase.explicit, hypothesis.Phase.generate],
                             suppress_health_check=list(hypothesis.HealthCheck))
        def fuzz(case):
            case.call_and_validate(base_url=fuzz_server.url, checks=CHECKS, timeout=30)

        fuzz()
    # The bodies reached the parsers (missing-shape, invalid-npy, invalid-safetensors, invalid-image, ...).
    for route, before in refused0.items():
        assert fuzz_server.metric("vaeserve_requests_total", route=route, status="422") > before, route
