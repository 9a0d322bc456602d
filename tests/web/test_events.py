"""The live-update publisher asks Redis who listens before it sends (channels_redis layer)."""

from __future__ import annotations

import uuid

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer

from stateguard_web.sagas.events import _Publisher


def test_it_sends_only_to_groups_someone_listens_to() -> None:
    layer = get_channel_layer()
    watched, unwatched, other = (f"run.{uuid.uuid4()}" for _ in range(3))
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(watched, channel)
    publisher = _Publisher()

    assert async_to_sync(publisher._listened)([unwatched, watched, other]) == [watched]
    async_to_sync(layer.group_discard)(watched, channel)
    assert async_to_sync(publisher._listened)([watched]) == []
