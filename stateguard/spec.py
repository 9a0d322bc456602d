"""What a guard is told to enforce: invariants, compensations and approval gates, validated.

Everything here is checked when the guard is built, so that a typo fails at start-up rather than
at the moment a customer needs a refund.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stateguard.exceptions import ConfigurationError, InvariantViolation
from stateguard.kinds import StepKind
from stateguard.retry import CompensationRetry

State = dict[str, Any]
InvariantFn = Callable[[State], bool]
CompensationFn = Callable[..., Any]  # fn(state, ctx) -> truthy if it undid something
ApprovalPredicate = Callable[[State], bool]


@dataclass(frozen=True, slots=True)
class Invariant:
    """A named check on the state. ``fn(state)`` returns ``True`` when the state is acceptable.

    ``False``, an ``AssertionError`` or an ``InvariantViolation`` mean "violated". Anything else
    (another exception, or a non-bool return such as a forgotten ``return``) is also treated as a
    violation, with a message saying so: a broken check must fail closed, never pass silently.
    """

    name: str
    fn: InvariantFn

    def violation(self, state: State) -> str | None:
        """``None`` if the invariant holds, else the message explaining why not."""
        try:
            ok = self.fn(state)
        except InvariantViolation as exc:
            return exc.message
        except AssertionError as exc:
            return str(exc) or "assertion failed"
        except Exception as exc:
            return f"invariant raised {type(exc).__name__}: {exc}"
        if ok is True:
            return None
        if ok is False:
            doc = inspect.getdoc(self.fn)
            return doc.splitlines()[0] if doc else "returned False"
        return f"invariant returned {ok!r}; it must return True or False"


@dataclass(frozen=True, slots=True)
class Compensation:
    """A compensation with its own settings.

    ``in_doubt_safe=True`` declares that ``fn`` checks before it acts (for example it looks for the
    charge before refunding it), so it may run for a step whose outcome is unknown because the
    process died inside it. Without it, such a step sends the run to ``needs_attention``.
    """

    fn: CompensationFn
    retry: CompensationRetry | None = None
    in_doubt_safe: bool = False

    def __post_init__(self) -> None:
        if not callable(self.fn):
            raise ConfigurationError(f"compensation {self.fn!r} is not callable")
        if self.retry is not None and not isinstance(self.retry, CompensationRetry):
            raise ConfigurationError("Compensation.retry must be a CompensationRetry")


def _name(fn: Any) -> str:
    return str(getattr(fn, "__name__", None) or type(fn).__name__)


def build_invariants(invariants: Iterable[Any]) -> tuple[Invariant, ...]:
    if isinstance(invariants, (str, bytes, Mapping)) or not isinstance(invariants, Iterable):
        raise ConfigurationError("invariants must be a list of callables")
    built: list[Invariant] = []
    for item in invariants:
        if isinstance(item, Invariant):
            built.append(item)
        elif isinstance(item, tuple) and len(item) == 2 and callable(item[1]):
            built.append(Invariant(str(item[0]), item[1]))
        elif callable(item):
            built.append(Invariant(_name(item), item))
        else:
            raise ConfigurationError(f"invariant {item!r} is not callable")
    names = [i.name for i in built]
    if len(set(names)) != len(names):
        raise ConfigurationError(f"invariant names must be unique, got {names}")
    return tuple(built)


def build_compensations(compensations: Mapping[str, Any] | None) -> dict[str, Compensation]:
    if compensations is None:
        return {}
    if not isinstance(compensations, Mapping):
        raise ConfigurationError("compensations must be a mapping of node name or tag to callable")
    built: dict[str, Compensation] = {}
    for key, value in compensations.items():
        if not isinstance(key, str) or not key:
            raise ConfigurationError(f"compensation key {key!r} must be a node name or tag")
        if isinstance(value, Compensation):
            built[key] = value
        elif callable(value):
            built[key] = Compensation(value)
        else:
            raise ConfigurationError(f"compensation for {key!r} is not callable: {value!r}")
    return built


def build_approvals(approvals: Iterable[str] | Mapping[str, Any] | None
                    ) -> dict[str, ApprovalPredicate | None]:
    """Node name -> predicate on the state (``None``: always ask)."""
    if approvals is None:
        return {}
    if isinstance(approvals, str):
        raise ConfigurationError("approvals must be a list of node names or a mapping")
    if isinstance(approvals, Mapping):
        built: dict[str, ApprovalPredicate | None] = {}
        for node, pred in approvals.items():
            if pred is True or pred is None:
                built[str(node)] = None
            elif callable(pred):
                built[str(node)] = pred
            else:
                raise ConfigurationError(f"approval predicate for {node!r} is not callable")
        return built
    return {str(node): None for node in approvals}


@dataclass(frozen=True, slots=True)
class GuardSpec:
    invariants: tuple[Invariant, ...]
    compensations: dict[str, Compensation]
    approvals: dict[str, ApprovalPredicate | None]
    retry: CompensationRetry
    # What a tool error that ToolNode told the model does (stateguard.tools): "auto",
    # "compensate" or "model", or a mapping of tool name or tag to one of them.
    on_tool_error: str | Mapping[str, str] = "auto"
    # Step kinds by node, tag, tool or tool tag (stateguard.kinds); a step with none is
    # compensatable. ``step_retries``: the retry settings given with a kind (Retriable), else
    # ``step_retry`` for every retriable step.
    kinds: Mapping[str, StepKind] = field(default_factory=dict)
    step_retries: Mapping[str, CompensationRetry] = field(default_factory=dict)
    step_retry: CompensationRetry = field(default_factory=CompensationRetry)

    def kind_for(self, node: str, tags: Iterable[str] = ()) -> StepKind:
        for key in (node, *tags):
            found = self.kinds.get(key)
            if found is not None:
                return found
        return StepKind.COMPENSATABLE

    def retry_for(self, node: str, tags: Iterable[str] = ()) -> CompensationRetry | None:
        """How a retriable step is retried; ``None`` for a step of another kind (one
        attempt: LangGraph's own ``retry_policy`` on the node still applies)."""
        for key in (node, *tags):
            if key in self.kinds:
                if self.kinds[key] != StepKind.RETRIABLE:
                    return None
                return self.step_retries.get(key, self.step_retry)
        return None

    @property
    def has_pivot(self) -> bool:
        return StepKind.PIVOT in self.kinds.values()

    def tool_error_policy(self, tool: str, tags: Iterable[str] = ()) -> str:
        policy = self.on_tool_error
        if isinstance(policy, str):
            return policy
        for key in (tool, *tags):
            if key in policy:
                return policy[key]
        return "auto"

    def compensation_for(self, node: str, tags: Iterable[str] = ()) -> Compensation | None:
        found = self.compensations.get(node)
        if found is None:
            for tag in tags:
                found = self.compensations.get(tag)
                if found is not None:
                    break
        return found

    def first_violation(self, state: State) -> tuple[Invariant, str] | None:
        for invariant in self.invariants:
            message = invariant.violation(state)
            if message is not None:
                return invariant, message
        return None

    def validate_names(self, nodes: Mapping[str, Iterable[str]],
                       tools: Mapping[str, Iterable[str]] | None = None,
                       tasks: Mapping[str, Iterable[str]] | None = None) -> None:
        """Fail if a compensation or approval names no node, tool, task or tag of the graph
        (``nodes``, ``tools`` and ``tasks``: name -> tags; tools are those its ToolNodes can
        call, tasks the ``@task``s its code calls, ``stateguard.functional``)."""
        tools, tasks = tools or {}, tasks or {}
        tags = {tag for node_tags in nodes.values() for tag in node_tags}
        tool_tags = {tag for tags_ in tools.values() for tag in tags_}
        known = f"nodes are {sorted(nodes)}, tags are {sorted(tags)}"
        if tools:
            known += f", tools are {sorted(tools)}, tool tags are {sorted(tool_tags)}"
        if tasks:
            known += f", tasks are {sorted(tasks)}"
        steps = {**tasks, **tools}  # called inside a node: tool calls and tasks
        step_tags = {tag for tags_ in steps.values() for tag in tags_}
        unknown = sorted(k for k in self.compensations
                         if k not in nodes and k not in tags and k not in steps
                         and k not in step_tags)
        if unknown:
            raise ConfigurationError(
                f"compensations name no node, tool or tag of the graph: {unknown}; {known}")
        unknown = sorted(k for k in self.approvals
                         if k not in nodes and k not in steps and k not in tool_tags)
        if unknown:
            raise ConfigurationError(
                f"approvals name no node or tool of the graph: {unknown}; {known}")
        unknown = sorted(k for k in self.kinds
                         if k not in nodes and k not in tags and k not in steps
                         and k not in step_tags)
        if unknown:
            raise ConfigurationError(
                f"kinds name no node, tool or tag of the graph: {unknown}; {known}")
        undone = sorted(name for name, name_tags in (*nodes.items(), *steps.items())
                        if self.kind_for(name, name_tags) == StepKind.PIVOT
                        and self.compensation_for(name, name_tags) is not None)
        if undone:
            raise ConfigurationError(
                f"{undone} are pivots (kinds) and have compensations: a pivot is the step "
                "that cannot be undone; drop its compensation, or make it compensatable")
        if not isinstance(self.on_tool_error, str):
            unknown = sorted(k for k in self.on_tool_error
                             if k not in tools and k not in tool_tags)
            if unknown:
                raise ConfigurationError(
                    f"on_tool_error names no tool or tool tag of the graph: {unknown}; {known}")
