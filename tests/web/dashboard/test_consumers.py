"""The dashboard's websockets through the whole ASGI stack (origin check, session, routing),
with Channels' ``WebsocketCommunicator``.

Most tests use the in-memory channel layer; the ones about what really travels (the
publisher's batches in order, a socket idle for longer than redis-py's read timeout) use the
Redis layer of the settings, as Daphne does.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.db import database_sync_to_async
from channels.layers import get_channel_layer
from channels.testing import WebsocketCommunicator
from django.test import Client

from stateguard_web.asgi import application
from stateguard_web.sagas import events
from stateguard_web.sagas.models import Run
from tests.web.api.world import make_user

# transaction=True: channels closes old database connections on every dispatch (stack notes,
# gotcha 8), which pytest-django allows only in a database test; and the consumer reads the
# users and runs this test made from another thread.
pytestmark = pytest.mark.django_db(transaction=True)

# What a browser sends from the dashboard's own page at http://localhost:8000/.
ORIGIN, HOST = (b"origin", b"http://localhost:8000"), (b"host", b"localhost:8000")


@pytest.fixture
def memory_layer(settings: Any) -> None:
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}


@pytest.fixture
def redis_layer(settings: Any) -> None:
    """The settings' Redis layer, made new for this test (a changed setting resets Channels'
    layers): Channels keeps one a process, and a receive lock an earlier test's event loop
    left taken failed in this one's ("Lock ... is bound to a different event loop")."""
    settings.CHANNEL_LAYERS = {**settings.CHANNEL_LAYERS}


@pytest.fixture
def world() -> dict[str, Any]:
    alice, bob = make_user("alice", "submitter"), make_user("bob", "submitter")
    people = {"alice": alice, "bob": bob, "vera": make_user("vera", "viewer"),
              "charlie": make_user("charlie", "operator"), "nobody": make_user("nobody")}
    runs = {"alices": Run.objects.create(agent="checkout", submitted_by=alice),
            "bobs": Run.objects.create(agent="checkout", submitted_by=bob)}
    cookies = {}
    for name, user in people.items():
        client = Client()
        client.force_login(user)
        cookies[name] = f"sessionid={client.cookies['sessionid'].value}".encode()
    return {**runs, "cookies": cookies}


def socket(path: str, cookie: bytes | None = None) -> WebsocketCommunicator:
    headers = [ORIGIN, HOST] + ([(b"cookie", cookie)] if cookie else [])
    return WebsocketCommunicator(application, path, headers=headers)


async def connects(path: str, cookie: bytes | None) -> bool:
    communicator = socket(path, cookie)
    connected, _ = await communicator.connect(timeout=5)
    await communicator.disconnect()
    return bool(connected)


def batch(run: Run, *types: str) -> dict[str, Any]:
    return {"type": "run.events", "events": [{"type": t, "run": str(run.code), "node": None,
                                              "step_id": None, "data": {}, "at": 0.0}
                                             for t in types]}


async def test_it_refuses_an_anonymous_user_and_a_user_without_a_role(
        memory_layer: None, world: dict[str, Any]) -> None:
    run = f"/ws/runs/{world['alices'].code}/"
    for path in ["/ws/runs/", run]:
        assert not await connects(path, None), path
        assert not await connects(path, world["cookies"]["nobody"]), path
        assert await connects(path, world["cookies"]["vera"]), path


async def test_it_refuses_a_submitter_on_someone_elses_run(
        memory_layer: None, world: dict[str, Any]) -> None:
    cookies = world["cookies"]
    assert await connects(f"/ws/runs/{world['alices'].code}/", cookies["alice"])
    assert not await connects(f"/ws/runs/{world['bobs'].code}/", cookies["alice"])
    assert await connects(f"/ws/runs/{world['bobs'].code}/", cookies["charlie"])
    assert not await connects("/ws/runs/00000000-0000-4000-8000-000000000000/",
                              cookies["charlie"])


async def test_it_refuses_a_page_of_another_site(memory_layer: None,
                                                 world: dict[str, Any]) -> None:
    for origin in [b"https://evil.example", b"http://localhost:9999", b"https://localhost:8000"]:
        communicator = WebsocketCommunicator(application, "/ws/runs/", headers=[
            (b"origin", origin), HOST, (b"cookie", world["cookies"]["charlie"])])
        connected, _ = await communicator.connect(timeout=5)
        assert not connected, origin


async def test_it_tells_a_submitter_only_of_its_own_runs(memory_layer: None,
                                                          world: dict[str, Any]) -> None:
    layer = get_channel_layer()
    alice, charlie = socket("/ws/runs/", world["cookies"]["alice"]), socket(
        "/ws/runs/", world["cookies"]["charlie"])
    assert (await alice.connect())[0] and (await charlie.connect())[0]
    mixed = batch(world["bobs"], "run.submitted")
    mixed["events"] += batch(world["alices"], "run.submitted", "run.status")["events"]
    await layer.group_send("runs", mixed)
    await layer.group_send("runs", batch(world["bobs"], "run.status"))
    await layer.group_send("runs", batch(world["alices"], "step.started"))
    seen = [e["type"] for e in (await alice.receive_json_from(timeout=3))["events"]]
    assert seen == ["run.submitted", "run.status"]
    seen = [e["type"] for e in (await alice.receive_json_from(timeout=3))["events"]]
    assert seen == ["step.started"]  # bob's batch alone was not sent at all
    assert await alice.receive_nothing(timeout=0.3)
    everything = [await charlie.receive_json_from(timeout=3) for _ in range(3)]
    assert [len(b["events"]) for b in everything] == [3, 1, 1]
    await alice.disconnect()
    await charlie.disconnect()


async def test_it_closes_a_socket_that_sends_garbage_and_keeps_serving_the_others(
        memory_layer: None, world: dict[str, Any]) -> None:
    layer = get_channel_layer()
    cookie = world["cookies"]["vera"]
    other = socket("/ws/runs/", cookie)
    assert (await other.connect())[0]
    frames: list[tuple[dict[str, Any], int]] = [
        ({"text_data": "not json {"}, 4003),
        ({"text_data": '{"type": "subscribe", "run": "*"}'}, 4003),
        ({"bytes_data": b"\x00\x01binary"}, 4003),
        ({"text_data": '{"type": "ping", "pad": "' + "x" * 5000 + '"}'}, 4009),
    ]
    for frame, code in frames:
        bad = socket("/ws/runs/", cookie)
        assert (await bad.connect())[0]
        await bad.send_to(**frame)
        closed = await bad.receive_output(timeout=3)
        assert closed == {"type": "websocket.close", "code": code}, frame
        await bad.disconnect()  # the server then drops the connection
    # The other socket was not disturbed: it still answers and still gets the run's events.
    await other.send_json_to({"type": "ping"})
    assert await other.receive_json_from(timeout=3) == {"type": "pong"}
    await layer.group_send("runs", batch(world["alices"], "run.status"))
    assert (await other.receive_json_from(timeout=3))["events"][0]["type"] == "run.status"
    await other.disconnect()


@pytest.mark.redis
async def test_it_forwards_the_publishers_batches_in_order(
        redis_layer: None, world: dict[str, Any], publisher: None) -> None:
    run = world["alices"]
    one, every = socket(f"/ws/runs/{run.code}/", world["cookies"]["alice"]), socket(
        "/ws/runs/", world["cookies"]["alice"])
    assert (await one.connect(timeout=5))[0] and (await every.connect(timeout=5))[0]

    def publish_many() -> None:
        for n in range(40):
            events.publish_change(run.code, "step.succeeded", n=n)
            if n % 8 == 7:
                time.sleep(0.08)  # longer than the coalescing window: several batches

    await sync_to_async(publish_many, thread_sensitive=False)()
    for communicator in (one, every):
        received: list[int] = []
        seqs: list[int] = []
        while len(received) < 40:
            message = await communicator.receive_json_from(timeout=5)
            assert message["type"] == "run.events"
            seqs.append(message["seq"])
            received += [e["data"]["n"] for e in message["events"]]
        assert received == list(range(40))
        assert len(seqs) > 1
        # Each batch's place in the order of all, counted before it was sent (dashboard/live.py)
        assert seqs == sorted(set(seqs)) and seqs[-1] <= events.position()  # type: ignore[operator]
        await communicator.disconnect()


@pytest.mark.redis
async def test_it_keeps_an_idle_socket_open_past_the_old_five_second_cut(
        redis_layer: None, world: dict[str, Any]) -> None:
    """The redis-py 8 trap: a read timeout shorter than channels_redis's 5 s blocking pop
    (BZPOPMIN) killed every idle consumer after about 5 s."""
    run = world["alices"]
    communicator = socket(f"/ws/runs/{run.code}/", world["cookies"]["charlie"])
    assert (await communicator.connect(timeout=5))[0]
    started = time.monotonic()
    # The trap closed a socket after 5 s idle: 7 s of silence would have seen it.
    assert await communicator.receive_nothing(timeout=7, interval=0.5)
    assert time.monotonic() - started > 6.5
    await get_channel_layer().group_send(f"run.{run.code}", batch(run, "run.status"))
    message = await communicator.receive_json_from(timeout=5)
    assert message["events"][0]["run"] == str(run.code)
    await communicator.send_json_to({"type": "ping"})
    assert await communicator.receive_json_from(timeout=5) == {"type": "pong"}
    await communicator.disconnect()


async def test_it_lets_the_list_socket_of_a_submitter_learn_of_its_new_runs(
        memory_layer: None, world: dict[str, Any]) -> None:
    """A run submitted after the socket opened is looked up when its first event comes."""
    alice = socket("/ws/runs/", world["cookies"]["alice"])
    assert (await alice.connect())[0]
    await alice.send_json_to({"type": "ping"})
    assert await alice.receive_json_from(timeout=3) == {"type": "pong"}
    new = await database_sync_to_async(Run.objects.create)(
        agent="checkout", submitted_by=world["alices"].submitted_by)
    await get_channel_layer().group_send("runs", batch(new, "run.submitted"))
    message = await alice.receive_json_from(timeout=3)
    assert message["events"][0]["run"] == str(new.code)
    await alice.disconnect()
    await asyncio.sleep(0)
