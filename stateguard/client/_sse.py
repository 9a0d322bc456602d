"""Server-Sent Events, read line by line as the HTML standard's parser reads them (its
"event stream interpretation"), for ``events``: sans-I/O, the sync and async clients feed it
the lines they read."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Message:
    id: str  # the last id the stream set (it carries over to the next messages)
    event: str
    data: str


class Decoder:
    """Feed it lines without their line ends; it returns a message at each blank line that
    ends one. ``retry`` is the reconnection delay the stream asked for (ms), if any."""

    def __init__(self, last_id: str = "") -> None:
        self.last_id = last_id
        self.retry: int | None = None
        self._event = ""
        self._data: list[str] = []

    def line(self, line: str) -> Message | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):  # a comment: a heartbeat
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\x00" not in value:
            self.last_id = value
        elif name == "retry" and value.isdigit():
            self.retry = int(value)
        return None

    def _dispatch(self) -> Message | None:
        data, event = self._data, self._event
        self._data, self._event = [], ""
        if not data:
            return None
        return Message(self.last_id, event or "message", "\n".join(data))
