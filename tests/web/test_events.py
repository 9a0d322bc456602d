"""The live-update publisher asks Redis who listens before it sends (channels_redis layer)."""

from __future__ import annotations

import uuid
from typing import Any

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from stateguard_web.sagas.events import _position_client, _Publisher, position


def test_it_sends_only_to_groups_someone_listens_to() -> None:
    layer = get_channel_layer()
    watched, unwatched, other = (f"run.{uuid.uuid4()}" for _ in range(3))
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(watched, channel)
    publisher = _Publisher()

    listened, seq = async_to_sync(publisher._listened)([unwatched, watched, other])
    assert listened == [watched]
    async_to_sync(layer.group_discard)(watched, channel)
    assert async_to_sync(publisher._listened)([watched]) == ([], seq + 1)  # type: ignore[operator]


def test_each_batch_counts_the_events_position_before_it_is_sent() -> None:
    publisher = _Publisher()
    before = position()
    assert before is not None
    _, seq = async_to_sync(publisher._listened)([f"run.{uuid.uuid4()}"])
    assert seq == before + 1 == position()


def test_the_position_is_unknown_without_redis(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    _position_client.cache_clear()
    try:
        assert position() is None
        settings.CHANNEL_LAYERS = {"default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [{"address": "redis://127.0.0.1:1/0"}]}}}  # nobody there
        _position_client.cache_clear()
        assert position() is None
    finally:
        _position_client.cache_clear()
