"""Waiting on the world: a courier books a pickup and calls back.

The tool asks a courier service to pick a parcel up, handing it a signed
callback URL (``ctx.callback_url()``) and the step's idempotency key, and
returns :class:`harness.Deferred`: the step is ``deferred``, the run
``waiting``, and no worker slot is held while the courier works. When the
courier POSTs its answer to the URL, ``harness serve`` completes the step
once and the run goes on. The fake courier below runs beside the worker;
from the repository root (``.venv/bin`` on the PATH)::

    export HARNESS_IMPORTS=examples.courier
    export HARNESS_PUBLIC_URL=http://127.0.0.1:8000
    export HARNESS_CALLBACK_SECRET=$(python -c 'import secrets; print(secrets.token_hex(32))')
    python -m examples.courier --delay 5 &         # the courier, on port 8765
    harness serve --port 8000 &                    # takes the callback
    celery -A tasks worker & celery -A tasks beat &
    harness start courier "ship parcel P-1 to 1 Main St" --json
    harness show RUN                               # step 1 deferred: waits for a callback
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import harness

#: Where the tool finds the courier (``COURIER_URL``).
DEFAULT_COURIER = "http://127.0.0.1:8765"


@harness.tool(effect="idempotent")
def book_pickup(parcel: str, address: str, ctx: harness.ToolContext) -> harness.Deferred:
    """Ask the courier to pick ``parcel`` up at ``address``; it calls back with
    a tracking number. The idempotency key makes a retried booking the same
    booking on the courier's side."""
    body = {
        "parcel": parcel,
        "address": address,
        "callback_url": ctx.callback_url(),
        "idempotency_key": ctx.idempotency_key,
    }
    _post(f"{os.environ.get('COURIER_URL', DEFAULT_COURIER)}/pickups", body)
    return harness.Deferred(timeout=24 * 3600)  # no answer in a day: the model is told


harness.register_agent(
    harness.Agent(
        name="courier",
        model=harness.ScriptedModel(
            [
                {
                    "tool_calls": [
                        {"name": "book_pickup", "args": {"parcel": "P-1", "address": "1 Main St"}}
                    ]
                },
                {"final": "The parcel is booked for pickup."},
            ]
        ),
        tools=[book_pickup],
    )
)


def _post(url: str, body: dict[str, Any]) -> bytes:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=10) as answer:
        return bytes(answer.read())


class Courier:
    """A fake courier service: ``POST /pickups`` books a pickup (once per
    idempotency key: a retry is the same booking) and, ``delay`` seconds
    later, POSTs ``{"tracking": ..., "parcel": ...}`` to its callback URL."""

    def __init__(self, port: int = 0, delay: float = 0.0) -> None:
        self.delay = delay
        self.bookings: dict[str, dict[str, Any]] = {}
        self.callbacks: list[threading.Thread] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        courier = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                booking = json.loads(self.rfile.read(length) or b"{}")
                fresh = courier.book(booking)
                self.send_response(202 if fresh else 200)
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler

    def book(self, booking: dict[str, Any]) -> bool:
        """Keep a booking and schedule its callback; False for a repeat."""
        key = str(booking.get("idempotency_key"))
        with self._lock:
            if key in self.bookings:
                return False
            self.bookings[key] = booking
            tracking = f"TRK-{len(self.bookings)}"
        answer = {"tracking": tracking, "parcel": booking.get("parcel")}
        thread = threading.Thread(target=self._call_back, args=(booking["callback_url"], answer))
        self.callbacks.append(thread)
        thread.start()
        return True

    def _call_back(self, url: str, answer: dict[str, Any]) -> None:
        if self.delay > 0:
            time.sleep(self.delay)  # the courier at work
        _post(url, answer)

    def wait_for_callbacks(self) -> None:
        """Until every callback scheduled so far was made."""
        for thread in list(self.callbacks):
            thread.join()

    def __enter__(self) -> Courier:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def main() -> None:
    parser = argparse.ArgumentParser(description="A fake courier that calls back.")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay", type=float, default=5.0, help="seconds before calling back")
    args = parser.parse_args()
    with Courier(args.port, args.delay) as courier:
        print(f"courier listening on {courier.url}", flush=True)
        threading.Event().wait()


if __name__ == "__main__":
    main()
