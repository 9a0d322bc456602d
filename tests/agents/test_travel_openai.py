"""The travel agent on a real model's client: langchain-openai's ``ChatOpenAI`` (the ``llm``
extra) over HTTP against a local OpenAI-compatible server that plays a script, the tools on
localstripe. What a hosted model would do is faked; the client, its retries and its parsing
of tool calls are the real ones."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import stripe

from agents.travel import chat_model
from stateguard import RunStatus, SagaAborted
from tests.agents.openai_server import Reply, Status, call, serve
from tests.agents.test_travel import guarded, log, trip
from tests.mail_server import MailServer

CHARGE = {"amount": 42_00, "currency": "usd", "email": "alice@example.com"}
FAST_429 = Status(429, {"retry-after-ms": "10"})  # the client waits that long, then asks again


@pytest.fixture
def openai_model(monkeypatch: pytest.MonkeyPatch) -> Any:
    def use(base_url: str) -> None:
        monkeypatch.setenv("STATEGUARD_TRAVEL_MODEL", "openai:gpt-scripted")
        monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
        monkeypatch.setenv("OPENAI_BASE_URL", base_url)
    return use


def tool_steps(guard: Any, config: Any) -> list[tuple[str, str]]:
    steps = sorted(guard.status(config).steps, key=lambda s: (s.done_seq or 0, s.node))
    return [(s.node, s.status) for s in steps if s.node not in ("agent", "tools")]


def test_the_provider_path_builds_langchain_openai_s_client(
        openai_model: Any) -> None:
    openai_model("http://127.0.0.1:9/v1")
    from langchain_openai import ChatOpenAI

    model = chat_model("openai:gpt-scripted")
    assert isinstance(model, ChatOpenAI)
    assert model.model_name == "gpt-scripted"


def test_parallel_calls_and_a_429_book_the_trip_with_one_charge(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        openai_model: Any, mail_server: MailServer) -> None:
    script = [FAST_429,  # the first answer is rate limited: the client retries it
              Reply(calls=(call("charge_card", CHARGE, "call_charge"),
                           call("reserve_hotel", {"destination": "Lisbon", "nights": 2},
                                "call_room"))),
              FAST_429,
              Reply(calls=(call("send_confirmation", {"email": "alice@example.com",
                                                      "destination": "Lisbon"}, "call_mail"),)),
              Reply("Your trip to Lisbon is booked.")]
    with serve(script) as (base_url, server):
        openai_model(base_url)
        guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
        config = {"configurable": {"thread_id": "trip-openai-1"}}
        out = guard.invoke(graph, trip(), config)

    assert out["messages"][-1].content == "Your trip to Lisbon is booked."
    assert len(server.requests) == 5  # three answers, two of them asked for twice
    assert server.requests[0] == server.requests[1]  # the retry resent the same request
    assert {t["function"]["name"] for t in server.requests[0]["tools"]} == {
        "charge_card", "reserve_hotel", "send_confirmation"}
    assert guard.status(config).run.status == RunStatus.SUCCEEDED
    assert sorted(tool_steps(guard, config)) == [
        ("charge_card", "succeeded"), ("reserve_hotel", "succeeded"),
        ("send_confirmation", "succeeded")]
    assert sorted(log(tmp_path)) == ["do:charge", "do:mail", "do:reserve"]
    assert [(c.amount, c.amount_refunded) for c in stripe_client.v1.charges.list().data] == [
        (42_00, 0)]
    # The model was sent each tool's answer, by call id, after the parallel calls.
    answered = [m["tool_call_id"] for m in server.requests[3]["messages"]
                if m["role"] == "tool"]
    assert sorted(answered) == ["call_charge", "call_room"]


def test_a_room_that_cannot_be_held_refunds_the_charge_once(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        openai_model: Any, mail_server: MailServer) -> None:
    script = [Reply(calls=(call("charge_card", CHARGE, "call_charge"),)),
              FAST_429,
              Reply(calls=(call("reserve_hotel", {"destination": "Atlantis", "nights": 2},
                                "call_room"),))]
    with serve(script) as (base_url, server):
        openai_model(base_url)
        guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
        config = {"configurable": {"thread_id": "trip-openai-2"}}
        with pytest.raises(SagaAborted, match="no hotel has rooms in Atlantis"):
            guard.invoke(graph, trip("Atlantis"), config)

    [charge] = stripe_client.v1.charges.list().data
    assert (charge.amount, charge.amount_refunded) == (42_00, 42_00)
    assert len(stripe_client.v1.refunds.list().data) == 1
    assert guard.status(config).run.status == RunStatus.COMPENSATED
    assert log(tmp_path) == ["do:charge", "undo:charge"]
    assert len(server.requests) == 3


def test_a_malformed_tool_call_after_the_charge_refunds_it_once(
        localstripe_url: str, stripe_client: stripe.StripeClient, tmp_path: Path,
        openai_model: Any, mail_server: MailServer) -> None:
    # The client cannot parse the room's arguments: no tool runs and the agent stops. Over a
    # charge that is no success (stateguard.malformed_calls): the turn is unwound.
    script = [Reply(calls=(call("charge_card", CHARGE, "call_charge"),)),
              Reply(calls=(call("reserve_hotel", '{"destination": "Lisbon", "nights": ',
                                "call_room"),))]
    with serve(script) as (base_url, server):
        openai_model(base_url)
        guard, graph = guarded(localstripe_url, tmp_path, mail_server.settings())
        config = {"configurable": {"thread_id": "trip-openai-3"}}
        with pytest.raises(SagaAborted, match=r"'reserve_hotel' \(call_room\) but the call "
                                              r"could not be parsed"):
            guard.invoke(graph, trip(), config)

    [charge] = stripe_client.v1.charges.list().data
    assert (charge.amount, charge.amount_refunded) == (42_00, 42_00)
    assert len(stripe_client.v1.refunds.list().data) == 1
    assert guard.status(config).run.status == RunStatus.COMPENSATED
    assert log(tmp_path) == ["do:charge", "undo:charge"]
    assert len(server.requests) == 2
