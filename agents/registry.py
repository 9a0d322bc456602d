"""The agents this deployment runs, by name.

An ``AgentSpec`` says everything the web app needs to run an agent as a saga: how to build its
graph, its invariants, compensations and approval gates, the schema its input must satisfy, what
a node's error does (``on_error``: unwind the run, hold it ``failed`` for an operator to retry, or
a function that decides per error), what to do with a run whose worker died (``on_crash``:
unwind it, or resume it when every node is idempotent) and how its compensations are retried
(``compensation_retry``; a ``Compensation(retry=...)`` of its own wins for that one).

Agents are plain Python below the web app: they never import Django. What they need from the
deployment (keys, addresses, folders) reaches them as an ``AgentSettings`` passed to their
factory: ``registry.get("checkout", AgentSettings(...))``; an agent of a team's own reads its
own options there (``settings.options_for(name)``, from ``STATEGUARD_AGENT_OPTIONS``).

Where agents come from: this repository's (``agents.checkout`` & co.), the modules a deployment
names (``use_modules``, from ``STATEGUARD_AGENTS``) and the installed packages' entry points in
the group ``stateguard.agents`` (each names a module that registers its agents when imported).
A team's agents live in its own package: docs/agents.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any, Literal

from langchain_core.runnables import RunnableConfig
from langgraph.graph import StateGraph
from pydantic import BaseModel, ConfigDict

from agents.mail import MailSettings
from stateguard import Compensation, CompensationRetry, ConfigurationError, RetryLater

# What a node's error does to a run (``StateGuardCheckpointer(on_error=...)``; the core does
# not export its alias): unwind it, hold it for an operator, or ask a function per error.
ErrorPolicy = Literal["compensate", "hold"]
OnError = ErrorPolicy | Callable[[BaseException], ErrorPolicy]


@dataclass(frozen=True, kw_only=True)
class AwsSettings:
    """Where the agents' AWS calls go (``agents/aws.py`` makes the clients): ``endpoint_url``
    is a local stand-in (moto's server under ``make run`` and the tests), or None for AWS
    itself; keys None leave the credentials to boto3's own chain (an instance role, say)."""

    region: str
    endpoint_url: str | None
    access_key_id: str | None = field(repr=False)
    secret_access_key: str | None = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class AgentSettings:
    """What the deployment tells its agents. The web app builds it from Django settings
    (``STRIPE_API_KEY``, ``STRIPE_API_BASE``, ``STATEGUARD_SANDBOX_DIR``, ``EMAIL_*`` for
    ``mail``, ``AWS_*`` for ``aws``); a script or a test builds its own. No defaults here: the
    deployment's settings are the one place for them (``mail=None``: this deployment sends no
    e-mail, and an agent that does refuses to start; ``aws=None`` likewise for AWS). Secrets
    stay out of the repr, which logs and tracebacks print."""

    stripe_api_key: str = field(repr=False)
    stripe_api_base: str
    sandbox_dir: Path
    # How often a Stripe call that did not get through is tried again, and how long one waits
    # for Stripe's answer (STRIPE_MAX_NETWORK_RETRIES, STRIPE_TIMEOUT_SECONDS; agents/
    # stripe_support.py). A script's or a test's own settings send each call once.
    stripe_max_network_retries: int = 0
    stripe_timeout: float = 30.0
    mail: MailSettings | None = None  # the SMTP server (agents.mail)
    aws: AwsSettings | None = None  # the AWS API (agents.aws)
    # Agent name -> the options the deployment gives it (STATEGUARD_AGENT_OPTIONS): the
    # addresses, keys and switches an agent of a team's own needs. Out of the repr: secrets.
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)

    def options_for(self, agent: str) -> Mapping[str, Any]:
        return self.options.get(agent, {})


class AgentInput(BaseModel):
    """The base of every agent's input schema: no field it does not name, and no coercion: the
    string ``"4200"`` is not an amount, nor ``1`` a ``true``, nor ``42.0`` a count. A caller's
    wrong type is their mistake to hear of (the API's 422), not one to guess the meaning of."""

    model_config = ConfigDict(extra="forbid", strict=True)


@dataclass(frozen=True)
class AgentSpec:
    name: str
    build: Callable[[], StateGraph[Any, Any, Any, Any]]
    input_schema: type[BaseModel]
    invariants: tuple[Callable[[dict[str, Any]], bool], ...] = ()
    compensations: Mapping[str, Any] = field(default_factory=dict)
    approvals: Mapping[str, Any] | tuple[str, ...] = ()
    on_error: OnError = "compensate"
    on_crash: Literal["unwind", "resume"] = "unwind"
    compensation_retry: CompensationRetry | None = None  # None: the core's default
    # Step kinds (stateguard.kinds): the pivot, the point of no return, and retriable steps.
    kinds: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        config = self.input_schema.model_config
        if config.get("strict") is not True or config.get("extra") != "forbid":
            raise ConfigurationError(
                f"agent {self.name!r}: its input_schema {self.input_schema.__name__} must be "
                "strict and forbid unknown fields: subclass agents.registry.AgentInput")

    def guard_kwargs(self, *, later: RetryLater | None = None) -> dict[str, Any]:
        """What to give a ``StateGuardCheckpointer`` for this agent. ``later`` is the
        deployment's durable wait: given to the agent's retry policy and to each
        compensation's own, unless that policy sets its ``later`` itself."""
        def patient(retry: CompensationRetry) -> CompensationRetry:
            return retry if later is None or retry.later is not None else replace(
                retry, later=later)

        compensations = {key: replace(c, retry=patient(c.retry))
                         if isinstance(c, Compensation) and c.retry is not None else c
                         for key, c in self.compensations.items()}
        return {"invariants": list(self.invariants), "compensations": compensations,
                "approvals": self.approvals or None, "on_error": self.on_error,
                "compensation_retry": patient(self.compensation_retry or CompensationRetry()),
                "kinds": self.kinds or None}


Factory = Callable[[AgentSettings], AgentSpec]
_REGISTRY: dict[str, Factory] = {}
_BENCHMARKS: set[str] = set()
_VERSIONS: dict[str, str] = {}  # agent -> the version its current factory declares ("": none)
_DRAINING: dict[str, dict[str, Factory]] = {}  # agent -> older version -> its factory


def register(name: str, *, version: str = "", draining: bool = False,
             benchmark: bool = False) -> Callable[[Factory], Factory]:
    """Register a factory that makes the agent's spec from the deployment's settings (called
    when the agent is first used, so that settings are read at run time, not at import).

    ``version`` is the version the agent declares ("4"): each run records it with its graph's
    shape (``stateguard.versions``), and a worker resumes a run only on the version it started
    on. Change it when a node's body changes in a way a run half-way through must not meet (the
    shape sees nodes and edges only). ``draining=True`` keeps an older version registered
    beside the current one, under the same name: new runs never use it, the runs that started
    on it finish on it (docs/agents.md, "Versions"); remove it once the agent's page says no
    run is left on it.

    ``benchmark=True`` marks an agent that measures the stack and does nothing for a user:
    whoever offers agents to users leaves it out unless benchmarks are enabled (``names``)."""
    def decorator(factory: Factory) -> Factory:
        kept = _DRAINING.setdefault(name, {})
        if draining:
            if not version or version in kept or _VERSIONS.get(name) == version:
                raise ConfigurationError(f"agent {name!r}: a draining version needs a version "
                                         f"of its own, not {version!r}")
            kept[version] = factory
            return factory
        if name in _REGISTRY:
            raise ConfigurationError(f"agent {name!r} is registered twice")
        if version and version in kept:
            raise ConfigurationError(f"agent {name!r}: version {version!r} is registered "
                                     "twice")
        _REGISTRY[name] = factory
        _VERSIONS[name] = version
        if benchmark:
            _BENCHMARKS.add(name)
        return factory
    return decorator


def names(*, benchmarks: bool = False) -> list[str]:
    """The registered agents' names; the benchmark agents only with ``benchmarks=True``."""
    _load()
    return sorted(n for n in _REGISTRY if benchmarks or n not in _BENCHMARKS)


def get(name: str, settings: AgentSettings, *, version: str | None = None) -> AgentSpec:
    """The agent's current spec, or with ``version`` the one of that version (the current one
    or one kept for draining); ``KeyError`` if there is none."""
    _load()
    factory = _REGISTRY.get(name)
    if factory is None:
        raise KeyError(name)
    if version is not None and version != _VERSIONS[name]:
        factory = _DRAINING[name][version]
    return factory(settings)


def version(name: str) -> str:
    """The version the agent's current factory declares ("" if none)."""
    _load()
    return _VERSIONS[name]


def draining(name: str) -> list[str]:
    """The older versions of the agent kept registered for the runs that started on them."""
    _load()
    return sorted(_DRAINING.get(name, {}))


def run_id(config: RunnableConfig) -> str:
    """The saga's run id inside a node that takes ``(state, config)``: LangGraph's thread id.

    A node keys what it records about its effects by it (an owner, an idempotency key), so
    that a compensation, which gets the same id as ``ctx.run_id``, finds what its run did."""
    return str(config["configurable"]["thread_id"])


ENTRY_POINT_GROUP = "stateguard.agents"
_BUILT_IN = ("agents.checkout", "agents.cleanup", "agents.noop", "agents.provision",
             "agents.travel")
_modules: tuple[str, ...] = ()
_loaded: set[str] = set()
_complete = False  # every source imported: names() and get() are asked on every request


def use_modules(modules: Sequence[str]) -> None:
    """Also load the agents of these modules (dotted paths, as ``STATEGUARD_AGENTS`` names
    them); they register with ``register`` when imported."""
    global _modules, _complete
    _modules = tuple(dict.fromkeys([*_modules, *modules]))
    _complete = False


def sources() -> list[tuple[str, str]]:
    """Where this process looks for agents: (module, what named it), in load order."""
    found = [(m, "built in") for m in _BUILT_IN]
    found += [(m, "STATEGUARD_AGENTS") for m in _modules]
    found += [(ep.value.partition(":")[0], f"entry point {ep.name!r} of "
               f"{ep.dist.name if ep.dist else 'an installed package'}")
              for ep in entry_points(group=ENTRY_POINT_GROUP)]
    return found


def _load() -> None:
    # Importing an agent module registers its agents (once: a failed import is tried again,
    # and says what named the module).
    global _complete
    if _complete:
        return
    for module, named_by in sources():
        if module in _loaded:
            continue
        try:
            importlib.import_module(module)
        except Exception as exc:
            raise ConfigurationError(f"agents: cannot import {module!r} ({named_by}): "
                                     f"{type(exc).__name__}: {exc}") from exc
        _loaded.add(module)
    if orphans := sorted(n for n, kept in _DRAINING.items() if kept and n not in _REGISTRY):
        raise ConfigurationError(f"agents {orphans} keep draining versions but have no current "
                                 "one: register one without draining=True")
    _complete = True
