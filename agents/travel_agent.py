"""Registers the travel agent (``agents.travel``) with the web app's registry."""

from __future__ import annotations

import os
import warnings
from typing import Any

from langgraph.prebuilt import create_react_agent
from langgraph.warnings import LangGraphDeprecatedSinceV10
from pydantic import Field

from agents.checkout import REFUND_RETRY
from agents.checkout_agent import stripe_client
from agents.registry import AgentInput, AgentSettings, AgentSpec, register
from agents.travel import Travel, TravelState, chat_model, prompt, total_charged_within_amount
from stateguard import Compensation


class TravelInput(AgentInput):
    email: str = Field(max_length=254, pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")
    destination: str = Field(min_length=1, max_length=100)  # "Atlantis" has no hotel
    nights: int = Field(default=1, gt=0, le=60)
    amount: int = Field(gt=0, le=1_000_000_00)  # smallest currency unit
    currency: str = Field(default="usd", pattern=r"^[a-z]{3}$")


@register("travel")
def spec(settings: AgentSettings) -> AgentSpec:
    travel = Travel(stripe_client(settings), settings.sandbox_dir)
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
        compensations={"charge_card": Compensation(travel.refund, retry=REFUND_RETRY),
                       "reserve_hotel": travel.cancel,
                       "send_confirmation": travel.apologise},
        approvals={"charge_card": lambda args: int(args.get("amount", 0)) > 100_00},
        description="An AI agent: charge the card, hold a hotel room, e-mail the confirmation; "
                    "each tool call a step, refunded if the room cannot be held.")
