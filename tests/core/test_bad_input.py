"""Bad configuration and bad operator input fail loudly, never pass silently."""

from __future__ import annotations

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from stateguard import (
    Compensation,
    CompensationRetry,
    ConfigurationError,
    InvalidRunState,
    RunNotFound,
    SagaAborted,
    StateGuardCheckpointer,
)
from tests.core.support import config, line_builder, undo

NODES = ["a", "b", "c"]


def test_it_treats_an_invariant_that_raises_as_a_recorded_violation() -> None:
    effects: list[str] = []

    def needs_key(state: dict[str, int]) -> bool:
        return state["missing"] > 0

    guard = StateGuardCheckpointer(invariants=[needs_key],
                                   compensations={"a": undo(effects, "a")})
    with pytest.raises(SagaAborted) as caught:
        guard.invoke(guard.compile(line_builder(NODES, effects)), {}, config("x1"))
    assert "invariant raised KeyError" in str(caught.value)
    assert effects == []  # caught on the input state, before any node ran


def test_it_treats_an_invariant_without_a_bool_as_violated() -> None:
    effects: list[str] = []

    def forgot_return(state: dict[str, int]) -> None:
        state.get("balance")

    guard = StateGuardCheckpointer(invariants=[forgot_return])
    with pytest.raises(SagaAborted, match="must return True or False"):
        guard.invoke(guard.compile(line_builder(NODES, effects)), {}, config("x2"))


@pytest.mark.parametrize("kwargs, message", [
    ({"compensations": {"a": "refund"}}, "not callable"),
    ({"compensations": {"a": Compensation(print), "": print}}, "node name or tag"),
    ({"compensations": ["a"]}, "mapping"),
    ({"invariants": [42]}, "not callable"),
    ({"invariants": "no_negative"}, "list of callables"),
    ({"invariants": [print, ("print", len)]}, "unique"),
    ({"approvals": "a"}, "list of node names"),
    ({"approvals": {"a": 3}}, "not callable"),
    ({"compensation_retry": 3}, "CompensationRetry"),
    ({"journal": object()}, "Journal protocol"),
    ({"saver": object()}, "BaseCheckpointSaver"),
    ({"on_error": "ignore"}, "on_error"),
    ({"lease_ttl": 0}, "lease_ttl"),
])
def test_it_rejects_bad_configuration_at_construction(kwargs: dict[str, object],
                                                       message: str) -> None:
    with pytest.raises(ConfigurationError, match=message):
        StateGuardCheckpointer(**kwargs)  # type: ignore[arg-type]


def test_it_rejects_bad_retry_settings() -> None:
    with pytest.raises(ConfigurationError):
        CompensationRetry(attempts=0)
    with pytest.raises(ConfigurationError):
        CompensationRetry(jitter=2)


def test_it_rejects_names_that_match_no_node_or_tag_when_compiling() -> None:
    effects: list[str] = []
    with pytest.raises(ConfigurationError, match=r"\['refund_typo'\]"):
        StateGuardCheckpointer(compensations={"refund_typo": print}).compile(
            line_builder(NODES, effects))
    with pytest.raises(ConfigurationError, match="approvals name no node"):
        StateGuardCheckpointer(approvals=["z"]).compile(line_builder(NODES, effects))


def test_it_accepts_a_tag_as_a_compensation_key() -> None:
    from langgraph.graph import START, StateGraph

    from tests.core.support import LineState

    effects: list[str] = []
    builder = StateGraph(LineState)
    builder.add_node("charge", lambda s: effects.append("charge") or {},
                     metadata={"tags": ["payment"]})

    def boom(state: object) -> dict[str, object]:
        raise ValueError("boom")

    builder.add_node("ship", boom)
    builder.add_edge(START, "charge")
    builder.add_edge("charge", "ship")
    guard = StateGuardCheckpointer(compensations={"payment": undo(effects, "payment")})
    with pytest.raises(SagaAborted):
        guard.invoke(guard.compile(builder), {}, config("tag"))
    assert effects == ["charge", "undo:payment"]


def test_it_refuses_operator_actions_that_do_not_fit_the_run() -> None:
    effects: list[str] = []
    guard = StateGuardCheckpointer()
    graph = guard.compile(line_builder(NODES, effects))
    with pytest.raises(RunNotFound):
        guard.retry(graph, config("never-ran"))
    guard.invoke(graph, {}, config("done"))
    with pytest.raises(InvalidRunState, match="only a paused run"):
        guard.approve(graph, config("done"), by="alice")
    with pytest.raises(InvalidRunState, match="succeeded"):
        guard.retry(graph, config("done"))
    with pytest.raises(ConfigurationError, match="thread_id"):
        guard.invoke(graph, {}, {"configurable": {}})
    with pytest.raises(ConfigurationError, match=r"guard\.compile"):
        guard.invoke(line_builder(NODES, effects).compile(checkpointer=InMemorySaver()), {},
                     config("y"))
