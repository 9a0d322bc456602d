"""The travel agent: an AI agent (``create_react_agent``) whose tools act on the world.

The model plans; its tools charge the card with Stripe (``charge_card``), hold a hotel room in
the local sandbox (``reserve_hotel``) and e-mail the confirmation over SMTP
(``send_confirmation``, through the deployment's mail server: ``agents.mail``). Each tool call
is a step of its own in the journal (``stateguard.tools``), and the compensations are keyed by
the tools' names:

- ``charge_card`` → refund what is left of the charge, reading the PaymentIntent from the call's
  result, with the call's idempotency key;
- ``reserve_hotel`` → cancel the room;
- ``send_confirmation`` → an e-mail cannot be unsent: send the apology, once, in reply to the
  confirmation (``In-Reply-To``). Both messages are named by their step's key (the call's
  ``effect_key()``, the compensation's ``ctx.idempotency_key``) and both are in the ledger.
  The apology is ``in_doubt_safe``: for a call that raised or died mid-send it asks the
  server's folder, where it can (``make run``), whether the confirmation was accepted, and
  apologises only then; where it cannot tell, it apologises (docs/deploy.md, "E-mail").
  ``send_confirmation`` is a retriable step: a send refused for now, cut or timed out is sent
  again, the same message, after asking the folder where it can (``agents.mail``), so a trip
  is unwound by its e-mail only once the attempts are spent.

Each compensation is ``in_doubt_safe``: a call that raised after its effect (Stripe charged, then
the answer was lost) or whose process died inside it saved no result, so the compensation looks
for the effect instead, by the run and the call, which every effect carries (the charge's
metadata, the room's number, the e-mail's ``Message-ID``), and undoes what it finds, once. The
saga chaos harness (``tests/agents/test_chaos.py``) fails each call at those points and checks
the world.

So a trip whose room cannot be held (the sandbox has no hotel in "Atlantis") ends with the card
refunded once and the run ``compensated``, and a charge over 100.00 waits for an operator, who
sees the call's arguments.

The model is chosen by the deployment: ``ScriptedTravelModel`` (the default, no network, no key)
plays a fixed plan decided by the request alone, so the demo, the tests and ``make run`` behave
the same every time; a real provider's model is used when ``STATEGUARD_TRAVEL_MODEL`` names one
(``openai:gpt-4o-mini``, ``anthropic:claude-3-5-haiku-latest``) and the ``llm`` extra and its
key are installed (docs/deploy.md).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import smtplib
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import stripe
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, InjectedToolCallId, tool
from langgraph.config import get_config
from langgraph.prebuilt import create_react_agent
from langgraph.prebuilt.chat_agent_executor import AgentState
from langgraph.warnings import LangGraphDeprecatedSinceV10
from pydantic import Field

from agents.mail import MAIL_STEP_RETRY, Mailer, mail_unsure
from agents.registry import AgentInput, AgentSettings, AgentSpec, register
from agents.stripe_support import REFUND_RETRY, stripe_client
from stateguard import (
    Compensation,
    ConfigurationError,
    Effect,
    ExceptionContext,
    Retriable,
    effect_key,
    record_effect,
    tool_calls,
)

logger = logging.getLogger(__name__)

ATLANTIS = "Atlantis"  # the sandbox has no hotel there: the reservation fails
RUN_KEY, CALL_KEY = "stateguard_run", "stateguard_tool_call"  # a charge's metadata
UNDO_KEY = "stateguard_compensation"  # a refund's metadata: the compensation's key
_ONCE: Any = {"max_network_retries": 0}  # a lost answer is looked up, never blindly resent
SYSTEM = ("You are a travel agent. Charge the customer's card for the trip with charge_card, "
          "then hold the hotel with reserve_hotel, then e-mail the confirmation with "
          "send_confirmation. Never charge more than the amount asked.")


class TravelState(AgentState):
    email: str
    destination: str
    nights: int
    amount: int  # in the currency's smallest unit
    currency: str


class NoRooms(Exception):
    pass


def request_of(state: dict[str, Any]) -> dict[str, Any]:
    return {k: state[k] for k in ("email", "destination", "nights", "amount", "currency")
            if k in state}


def prompt(state: dict[str, Any]) -> list[BaseMessage]:
    """What the model reads: the instructions, the request, then the conversation so far (the
    run's input is the request itself: a run starts with no messages)."""
    request = HumanMessage(f"Trip request: {json.dumps(request_of(state), sort_keys=True)}")
    return [SystemMessage(SYSTEM), request, *state.get("messages", [])]


class ScriptedTravelModel(BaseChatModel):
    """A chat model that plays the travel plan for the request in the conversation: charge,
    reserve, confirm, then a summary; it stops at a tool error and says so. Stateless: what
    it answers depends on the messages alone, so a run resumed by another worker goes on."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedTravelModel:
        return self

    @property
    def _llm_type(self) -> str:
        return "scripted-travel"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=self.next_message(messages))])

    @staticmethod
    def next_message(messages: Sequence[BaseMessage]) -> AIMessage:
        request: dict[str, Any] = {}
        for message in messages:
            if isinstance(message, HumanMessage) and str(message.content).startswith(
                    "Trip request: "):
                request = json.loads(str(message.content).removeprefix("Trip request: "))
        answered = {m.name: m for m in messages if isinstance(m, ToolMessage)}
        failed = next((m for m in answered.values() if m.status == "error"), None)
        if failed is not None:
            return AIMessage(f"Sorry, {failed.name} failed: {failed.content}")
        plan = [("charge_card", {"amount": request.get("amount", 0),
                                 "currency": request.get("currency", "usd"),
                                 "email": request.get("email", "")}),
                ("reserve_hotel", {"destination": request.get("destination", ""),
                                   "nights": request.get("nights", 1)}),
                ("send_confirmation", {"email": request.get("email", ""),
                                       "destination": request.get("destination", "")})]
        for name, args in plan:
            if name not in answered:
                return AIMessage("", tool_calls=[{"name": name, "args": args,
                                                  "id": f"call_{name}", "type": "tool_call"}])
        return AIMessage(f"Your trip to {request.get('destination')} is booked.")


def chat_model(name: str) -> BaseChatModel:
    """The model ``STATEGUARD_TRAVEL_MODEL`` names: "" for the scripted one, else
    "<provider>:<model>" of an installed LangChain integration (the ``llm`` extra)."""
    if not name:
        return ScriptedTravelModel()
    provider, _, model = name.partition(":")
    if provider == "openai":
        from langchain_openai import ChatOpenAI  # type: ignore[import-not-found]

        return ChatOpenAI(model=model)  # type: ignore[no-any-return]
    if provider == "anthropic":
        from langchain_anthropic import ChatAnthropic  # type: ignore[import-not-found]

        return ChatAnthropic(model=model)  # type: ignore[no-any-return]
    raise ValueError(f"STATEGUARD_TRAVEL_MODEL: unknown provider {provider!r} "
                     "(openai:<model> or anthropic:<model>, or empty for the scripted model)")


def _run() -> str:
    """The run's id inside a tool (LangGraph's thread id). Only a tool may ask: a compensation
    runs outside any runnable and reads ``ctx.run_id``."""
    return str(get_config()["configurable"]["thread_id"])


class Travel:
    """The travel agent's tools and their compensations, over a Stripe client, a sandbox (the
    hotel's) and a mail server."""

    def __init__(self, client: stripe.StripeClient, sandbox: Path, mailer: Mailer) -> None:
        self.client = client
        self.sandbox = sandbox.resolve()
        self.sandbox.mkdir(parents=True, exist_ok=True)
        self.mailer = mailer

    def log(self, line: str) -> None:
        # One write per line with O_APPEND: lines from several workers never interleave.
        fd = os.open(self.sandbox / "effects.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o644)
        try:
            os.write(fd, f"{line}\n".encode())
        finally:
            os.close(fd)

    def tools(self) -> list[BaseTool]:
        travel = self

        # The call's id (injected by ToolNode, never asked of the model) names the effect, so
        # that a compensation can find it when the call saved no result.
        @tool
        def charge_card(amount: int, currency: str, email: str,
                        call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
            """Charge the customer's card ``amount`` (smallest currency unit) for the trip."""
            return travel.charge(amount, currency, email, call_id)

        @tool
        def reserve_hotel(destination: str, nights: int,
                          call_id: Annotated[str, InjectedToolCallId]) -> dict[str, Any]:
            """Hold a hotel room at ``destination`` for ``nights`` nights."""
            return travel.reserve(destination, nights, _run(), call_id)

        @tool
        def send_confirmation(email: str, destination: str) -> dict[str, str]:
            """E-mail the customer that the trip is booked."""
            return travel.confirm(_run(), email, destination)

        return [charge_card, reserve_hotel, send_confirmation]

    # -- tools ------------------------------------------------------------------------------
    def charge(self, amount: int, currency: str, email: str, call_id: str) -> dict[str, Any]:
        run = _run()
        key = charge_key(run, call_id)
        customer = self.client.v1.customers.create(
            params={"email": email}, options={"idempotency_key": f"{key}:customer"})
        intent = self.client.v1.payment_intents.create(params={
            "amount": amount, "currency": currency, "customer": customer.id,
            "payment_method": "pm_card_visa", "confirm": True,
            "metadata": {RUN_KEY: run, CALL_KEY: call_id}},
            options=_ONCE | {"idempotency_key": key})
        record_charge(intent, key)
        self.log(f"do:charge:{intent.id}")
        return {"payment_intent_id": intent.id, "amount": int(intent.amount),
                "currency": str(intent.currency)}

    def reserve(self, destination: str, nights: int, run: str, call_id: str) -> dict[str, Any]:
        if destination == ATLANTIS:
            raise NoRooms(f"no hotel has rooms in {destination}")
        reservation = reservation_of(run, call_id)  # the same on a retry: one room
        room = self.sandbox / "hotel" / reservation
        room.parent.mkdir(exist_ok=True)
        room.write_text(f"{destination}:{nights}")
        self.log(f"do:reserve:{reservation}:{destination}:{nights}")
        record_effect(Effect("sandbox", "reservation", reservation))
        return {"reservation_id": reservation, "destination": destination, "nights": nights}

    def confirm(self, run: str, to: str, destination: str) -> dict[str, str]:
        """E-mail the confirmation, named by the call's key: the same message however often
        the call runs, and not handed to a server that says it has it already."""
        key = effect_key()
        message_id = self.mailer.message_id(key)
        if self.mailer.accepted(message_id) is not True:
            self.mailer.send(self.mailer.compose(
                to=to, subject=f"Your trip to {destination}", message_id=message_id, run=run,
                body=f"Your trip to {destination} is booked."))
        record_effect(Effect("smtp", "email", message_id, idempotency_key=key))
        self.log(f"do:mail:{message_id}")
        return {"message_id": message_id, "to": to}

    # -- compensations ----------------------------------------------------------------------
    def refund(self, state: dict[str, Any], ctx: ExceptionContext) -> str | bool:
        """Refund what Stripe says is left of the call's charge, with the call's key: the
        charge its result names, else (it raised, or died, saving none) the one Stripe has
        for the run and the call.

        The ledger gets what Stripe has even when its recorder died: the charge (the call may
        have died between Stripe's answer and its record) and the refunds an earlier attempt
        of this compensation made (found by their metadata: that attempt died, or its answer
        was lost, before it recorded them), which it reports instead of refunding again."""
        charge = ctx.tool_call.result if ctx.tool_call else None
        if isinstance(charge, dict) and "payment_intent_id" in charge:
            intent = self.client.v1.payment_intents.retrieve(charge["payment_intent_id"])
        else:
            intent = self.find_charge(ctx)
            if intent is None:
                return False  # no charge was made: nothing to undo
        if ctx.tool_call is not None:
            record_charge(intent, charge_key(ctx.run_id, ctx.tool_call.id))
        latest = intent.latest_charge  # an id on Stripe, an expanded object on localstripe
        charge_id = str(latest if isinstance(latest, str) else latest.id)
        made = [r for r in self.client.v1.refunds.list(params={"charge": charge_id, "limit": 100})
                .auto_paging_iter() if r.status not in ("failed", "canceled")
                and (r.metadata.to_dict() if r.metadata else {}).get(UNDO_KEY)
                == ctx.idempotency_key]
        for earlier in made:
            self.record_refund(earlier, intent.id, ctx)
        stripe_charge = self.client.v1.charges.retrieve(charge_id)
        remaining = stripe_charge.amount - (stripe_charge.amount_refunded or 0)
        if remaining <= 0:
            return "; ".join(f"found {r.id}: {r.amount} {r.currency} refunded by an earlier "
                             "attempt" for r in made) or False
        refund = self.client.v1.refunds.create(
            params={"charge": charge_id, "amount": remaining,
                    "metadata": {RUN_KEY: ctx.run_id, "reason": ctx.reason,
                                 UNDO_KEY: ctx.idempotency_key}},
            options=_ONCE | {"idempotency_key": ctx.idempotency_key})
        self.record_refund(refund, intent.id, ctx)
        self.log(f"undo:charge:{intent.id}")
        return f"refunded {refund.id}: {refund.amount} {refund.currency}"

    @staticmethod
    def record_refund(refund: Any, intent_id: str, ctx: ExceptionContext) -> None:
        record_effect(Effect("stripe", "refund", refund.id, amount=int(refund.amount),
                             currency=str(refund.currency), idempotency_key=ctx.idempotency_key,
                             undoes=intent_id))

    def find_charge(self, ctx: ExceptionContext) -> Any | None:
        """The succeeded PaymentIntent the run's call made, found by its metadata among the
        charges of the customers with the call's e-mail."""
        if ctx.tool_call is None or not ctx.tool_call.args.get("email"):
            return None
        customers = self.client.v1.customers.list(
            params={"email": str(ctx.tool_call.args["email"]), "limit": 100})
        for customer in customers.auto_paging_iter():
            intents = self.client.v1.payment_intents.list(
                params={"customer": customer.id, "limit": 100})
            for intent in intents.auto_paging_iter():
                metadata = intent.metadata.to_dict() if intent.metadata else {}
                if (metadata.get(RUN_KEY) == ctx.run_id and intent.status == "succeeded"
                        and metadata.get(CALL_KEY) == ctx.tool_call.id):
                    return intent
        return None

    def cancel(self, state: dict[str, Any], ctx: ExceptionContext) -> bool:
        """Give the room back, if the call held one: its number names the run and the call,
        so it is found without the call's result."""
        if ctx.tool_call is None:
            return False
        reservation = reservation_of(ctx.run_id, ctx.tool_call.id)
        room = self.sandbox / "hotel" / reservation
        if not room.exists():
            return False  # never held, or given back already (an earlier attempt)
        room.unlink()
        self.log(f"undo:reserve:{reservation}")
        record_effect(Effect("sandbox", "cancellation", f"cancel_{reservation}",
                             undoes=reservation))
        return True

    def apologise(self, state: dict[str, Any], ctx: ExceptionContext) -> str | bool:
        """Take the confirmation back: the apology, in reply to it, once. For a call whose
        outcome is unknown (it raised, or its process died mid-send), the server's folder says
        whether the confirmation was accepted where it can; where it cannot, the apology goes
        out anyway: a customer told twice is better than one left believing a cancelled trip
        is booked (docs/deploy.md, "E-mail")."""
        call = ctx.tool_call
        args = call.args if call else {}
        key = effect_key()  # the call's key, so the confirmation's Message-ID, whatever it did
        confirmation = self.mailer.message_id(key)
        result = call.result if call else None
        if not (isinstance(result, dict) and result.get("message_id") == confirmation):
            accepted = self.mailer.accepted(confirmation)
            if accepted is False:
                return False  # the server never accepted it: nothing to take back
            if accepted:  # the call died before it could say so: the ledger says it now
                record_effect(Effect("smtp", "email", confirmation, idempotency_key=key))
        apology = self.mailer.message_id(ctx.idempotency_key)
        if self.mailer.accepted(apology) is not True:  # an earlier attempt's was not accepted
            destination, to = str(args.get("destination", "")), str(args.get("email", ""))
            try:
                self.mailer.send(self.mailer.compose(
                    to=to, subject=f"Cancelled: your trip to {destination}",
                    message_id=apology, run=ctx.run_id, in_reply_to=confirmation,
                    body=(f"We could not complete your booking of the trip to {destination}: "
                          "it is cancelled, and whatever you were charged for it is refunded.\n"
                          "If you received our confirmation, it no longer holds. We are sorry.")))
            except (ValueError, smtplib.SMTPRecipientsRefused) as exc:
                if mail_unsure(exc):
                    raise  # refused for now (4xx): try again
                # Not an address, or refused for good: the confirmation reached it no more.
                logger.warning("run %s: no apology to %r: %s", ctx.run_id, to, exc)
                return False
        record_effect(Effect("smtp", "email", apology, idempotency_key=ctx.idempotency_key,
                             undoes=confirmation))
        self.log(f"undo:mail:{confirmation}")
        return f"apologised with {apology} in reply to {confirmation}"


def charge_key(run: str, call_id: str) -> str:
    """The idempotency key of a ``charge_card`` call: its Stripe request's and its effect's."""
    return f"stateguard:{run}:charge_card:{call_id}"


def record_charge(intent: Any, key: str) -> None:
    """The ledger's record of a charge, by its PaymentIntent (once, however often found)."""
    record_effect(Effect("stripe", "charge", intent.id, amount=int(intent.amount),
                         currency=str(intent.currency), idempotency_key=key))


def reservation_of(run: str, call_id: str) -> str:
    """The room's number: the run's and the call's, so a compensation finds it by them."""
    return "res_" + hashlib.sha256(f"{run}\x00{call_id}".encode()).hexdigest()[:12]


def total_charged_within_amount(state: dict[str, Any]) -> bool:
    """the agent never charges more than the amount asked"""
    return sum(int(c.args.get("amount", 0)) for c in tool_calls(state, "charge_card")) <= int(
        state.get("amount", 0))


# -- registered with the web app ----------------------------------------------------------
class TravelInput(AgentInput):
    email: str = Field(max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    destination: str = Field(min_length=1, max_length=100)  # "Atlantis" has no hotel
    nights: int = Field(default=1, gt=0, le=60)
    amount: int = Field(gt=0, le=1_000_000_00)  # smallest currency unit
    currency: str = Field(default="usd", pattern=r"^[a-z]{3}$")


@register("travel", version="1")
def spec(settings: AgentSettings) -> AgentSpec:
    if settings.mail is None:
        raise ConfigurationError("agent 'travel' e-mails its customers: give it a mail server "
                                 "(AgentSettings.mail; the web app's EMAIL_* settings)")
    travel = Travel(stripe_client(settings), settings.sandbox_dir, Mailer(settings.mail))
    # Read here, not at import: the deployment picks the model (docs/deploy.md).
    model = chat_model(os.environ.get("STATEGUARD_TRAVEL_MODEL", ""))

    def build() -> Any:
        with warnings.catch_warnings():  # moved to langchain.agents, which we do not install
            warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
            return create_react_agent(model, travel.tools(), prompt=prompt,
                                      state_schema=TravelState).builder

    return AgentSpec(
        name="travel", build=build, input_schema=TravelInput,
        invariants=(total_charged_within_amount,),
        # in_doubt_safe: each looks for its call's effect before it undoes it (see above).
        compensations={"charge_card": Compensation(travel.refund, retry=REFUND_RETRY,
                                                   in_doubt_safe=True),
                       "reserve_hotel": Compensation(travel.cancel, in_doubt_safe=True),
                       "send_confirmation": Compensation(travel.apologise, in_doubt_safe=True)},
        approvals={"charge_card": lambda args: int(args.get("amount", 0)) > 100_00},
        # A send refused for now, cut or timed out is sent again, as the same message; each
        # attempt first asks the server whether it has it, where it can (agents/mail.py).
        kinds={"send_confirmation": Retriable(MAIL_STEP_RETRY)},
        description="An AI agent: charge the card, hold a hotel room, e-mail the confirmation; "
                    "each tool call a step, refunded if the room cannot be held.")
