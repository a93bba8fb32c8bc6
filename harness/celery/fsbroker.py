"""The embedded broker: kombu's ``filesystem://`` transport, made safe for crashes.

kombu's transport creates a message file in the queue folder and then writes
it, so a consumer polling at that moment can take an empty file, and the
worker dies on the JSON error. Consumers also move a message to the system
temporary folder, which may be another filesystem, turning a rename into a
copy that two consumers can both make. Here a message is written to a staging
folder and renamed into the queue (readers only ever see whole files), and a
consumer claims one by renaming it into a claim folder on the same filesystem
(exactly one consumer wins). The folders are made when a channel opens,
not by the configuration. Selected with ``broker_transport`` in
:mod:`harness.celery.config`; the URL stays ``filesystem://``.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from queue import Empty
from time import monotonic
from typing import Any

from kombu.transport import filesystem
from kombu.utils.json import dumps, loads

#: Transport options that name a folder this transport reads or writes.
FOLDERS = ("data_folder_in", "data_folder_out", "staging_folder", "claim_folder", "control_folder")


class Channel(filesystem.Channel):
    def __init__(self, connection: Any, **kwargs: Any) -> None:
        options = connection.client.transport_options
        for option in FOLDERS:
            if option in options:
                Path(options[option]).mkdir(parents=True, exist_ok=True)
        super().__init__(connection, **kwargs)

    def _folder(self, option: str) -> str:
        return str(self.transport_options[option])

    # kombu's own base classes disagree on this signature; we match the filesystem one.
    def _put(self, queue: str, payload: dict[str, Any], **kwargs: Any) -> None:  # type: ignore[override]
        name = f"{round(monotonic() * 1000):015d}_{uuid.uuid4()}.{queue}.msg"
        staged = os.path.join(self._folder("staging_folder"), name)
        with open(staged, "wb") as f:
            f.write(dumps(payload).encode())
        os.rename(staged, os.path.join(self.data_folder_out, name))

    def _get(self, queue: str, timeout: float | None = None) -> Any:
        suffix = f".{queue}.msg"
        claims = self._folder("claim_folder")
        for name in sorted(os.listdir(self.data_folder_in)):
            if not name.endswith(suffix):
                continue
            claimed = os.path.join(claims, name)
            try:
                os.rename(os.path.join(self.data_folder_in, name), claimed)
            except FileNotFoundError:
                continue  # another consumer won it
            with open(claimed, "rb") as f:
                payload = f.read()
            os.unlink(claimed)
            return loads(payload.decode())
        raise Empty()


class Transport(filesystem.Transport):
    Channel = Channel
