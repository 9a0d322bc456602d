"""Settings for ``bench/p5_ws.py`` only: the site's own, and with ``P5_LAYER=pubsub`` the
channel layer swapped for channels_redis's ``RedisPubSubChannelLayer`` (one PUBLISH per group
message, each server process fanning it out to its own consumers), to see what the layer costs
on the runs list's many sockets. Nothing here is served by a deployment."""

from __future__ import annotations

from stateguard_web.settings import *  # noqa: F403

if env.str("P5_LAYER", default="") == "pubsub":  # noqa: F405
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.pubsub.RedisPubSubChannelLayer",
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": None}]},  # noqa: F405
        },
    }
