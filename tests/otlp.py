"""A local OTLP/HTTP trace receiver for tests: what a collector would get.

A stdlib HTTP server on 127.0.0.1 that takes ``POST /v1/traces`` bodies
(``ExportTraceServiceRequest`` in protobuf, gzip or not), decodes them with
the ``opentelemetry-proto`` package that the OTLP exporter depends on, and
keeps every span as a :class:`ReceivedSpan`. Point a process at it with
``OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint``.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

STATUS_ERROR = 2  # opentelemetry.proto.trace.v1.Status.STATUS_CODE_ERROR


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as it arrived; ids in hex, attributes as plain values."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str  # "" for a root span
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id) of each link
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status_code: int
    status_message: str


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    return None if kind is None else getattr(v, kind)


def _attributes(items: Any) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in items if isinstance(kv, KeyValue)}


def decode(body: bytes) -> list[ReceivedSpan]:
    """The spans of one ``ExportTraceServiceRequest``."""
    request = ExportTraceServiceRequest.FromString(body)
    spans = []
    for resource_spans in request.resource_spans:
        resource = _attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for s in scope_spans.spans:
                spans.append(
                    ReceivedSpan(
                        name=s.name,
                        trace_id=s.trace_id.hex(),
                        span_id=s.span_id.hex(),
                        parent_span_id=s.parent_span_id.hex(),
                        links=tuple((link.trace_id.hex(), link.span_id.hex()) for link in s.links),
                        attributes=_attributes(s.attributes),
                        resource=resource,
                        status_code=s.status.code,
                        status_message=s.status.message,
                    )
                )
    return spans


class OTLPReceiver:
    """Collects the spans exported to it, until closed."""

    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self.requests = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                spans = decode(body)
                with receiver._lock:
                    receiver.spans.extend(spans)
                    receiver.requests += 1
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        """The base URL for ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def received(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, what: str, check: Callable[[list[ReceivedSpan]], bool], timeout: float = 30.0
    ) -> list[ReceivedSpan]:
        """Poll until ``check(spans)`` holds; the spans then."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if check(spans):
                return spans
            if time.monotonic() > deadline:
                raise TimeoutError(f"gave up waiting for {what}: {len(spans)} spans received")
            time.sleep(0.05)

    def __enter__(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
