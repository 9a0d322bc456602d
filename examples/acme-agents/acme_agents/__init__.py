"""ACME's invoicing agent, run by StateGuard's web app from this package alone.

``acme_invoice``: issue an invoice (a file in the deployment's sandbox, ``invoices/``), then
send it; when sending fails the invoice is voided. Its options come from the deployment
(``STATEGUARD_AGENT_OPTIONS='{"acme_invoice": {"prefix": "ACME"}}'``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph
from pydantic import Field

from agents.registry import AgentInput, AgentSettings, AgentSpec, register, run_id
from stateguard import ConfigurationError


class InvoiceInput(AgentInput):
    customer: str = Field(min_length=1, max_length=100)
    amount: int = Field(gt=0)
    fail_sending: bool = False


class InvoiceState(TypedDict, total=False):
    customer: str
    amount: int
    fail_sending: bool
    invoice: str


class SendingFailed(Exception):
    pass


@register("acme_invoice")
def spec(settings: AgentSettings) -> AgentSpec:
    options = dict(settings.options_for("acme_invoice"))
    prefix = options.pop("prefix", "INV")
    if not isinstance(prefix, str) or not prefix.isalnum() or options:
        raise ConfigurationError(
            "acme_invoice: its options are {'prefix': <letters and digits>}, not "
            f"{settings.options_for('acme_invoice')!r}")
    folder = Path(settings.sandbox_dir) / "invoices"

    def issue(state: InvoiceState, config: RunnableConfig) -> dict[str, Any]:
        folder.mkdir(parents=True, exist_ok=True)
        number = f"{prefix}-{run_id(config)[:8]}"
        (folder / f"{number}.json").write_text(json.dumps(
            {"customer": state["customer"], "amount": state["amount"], "status": "issued"}))
        return {"invoice": number}

    def send(state: InvoiceState) -> dict[str, Any]:
        if state.get("fail_sending"):
            raise SendingFailed(f"the mail server refused invoice {state['invoice']}")
        return {}

    def void(state: dict[str, Any], ctx: Any) -> bool:
        path = folder / f"{state['invoice']}.json"
        invoice = json.loads(path.read_text())
        path.write_text(json.dumps({**invoice, "status": "void"}))
        return True

    def build() -> StateGraph[Any, Any, Any, Any]:
        builder: StateGraph[Any, Any, Any, Any] = StateGraph(InvoiceState)
        builder.add_node("issue_invoice", issue)
        builder.add_node("send_invoice", send)
        builder.add_edge(START, "issue_invoice")
        builder.add_edge("issue_invoice", "send_invoice")
        builder.add_edge("send_invoice", END)
        return builder

    return AgentSpec(name="acme_invoice", build=build, input_schema=InvoiceInput,
                     compensations={"issue_invoice": void},
                     description="Issue an invoice and send it; void it if sending fails.")
