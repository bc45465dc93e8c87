"""`@actor`, the `Actor` it makes, and loading actor modules into a `Registry`.

There is no global registry: `load_actors` imports the named modules and collects the
`Actor` objects they define, so each worker (and each reload) builds its own.

An actor is also a producer: `send_email.send(payload)` enqueues a job of its type with
its declared defaults, through `goqueue.client` (imported only when called, so a worker
that never sends loads no HTTP code). A keyword-form actor (`TypedActor`) takes the
handler's own arguments instead: `resize.send(url, width=50)`.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Concatenate, Generic, ParamSpec, Protocol, overload

import msgspec
from goqueue.actors.errors import ActorDefinitionError
from goqueue.actors.job_context import Context
from goqueue.actors.protocol import ActorInfo
from goqueue.actors.typed import Form, Signature, read

if TYPE_CHECKING:
    from typing import Unpack

    from goqueue.api.wire import JobOut
    from goqueue.client.core import AsyncProducer, JobOptions, Producer

_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{1,200}$")
_OPTIONS = (
    "timeout",
    "max_retries",
    "concurrency",
    "queue",
    "priority",
    "schedule",
    "rate_limit",
    "key_concurrency",
    "key_rate_limit",
)
_RATE = re.compile(r"\s*[1-9][0-9]{0,5}\s*/\s*[smh]\s*")
_CRON_FIELD = re.compile(r"[0-9A-Za-z*/,\-#?LW]+")


Handler = Callable[..., Any]
P = ParamSpec("P")


@dataclass(frozen=True, slots=True)
class Actor:
    """A registered handler and its declared defaults. Its signature's form (`typed.py`)
    says how it takes its payload; this class sends the classic and struct forms, whose
    `.send` takes the payload whole (`TypedActor` sends the keyword form)."""

    name: str
    fn: Handler
    timeout: float | None = None
    max_retries: int | None = None
    concurrency: int | None = None
    queue: str | None = None
    priority: int | None = None
    schedule: str | None = None  # five-field cron (UTC): the node enqueues one job per tick
    rate_limit: str | None = None  # at most N starts per second, minute or hour: "20/s"
    key_concurrency: int | None = None  # at most N running jobs per `concurrency_key`
    key_rate_limit: str | None = None  # at most N starts per key per second, minute or hour
    signature: Signature = field(default=None, repr=False, compare=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.signature is None:  # an Actor made by hand
            object.__setattr__(self, "signature", read(self.fn, self.name))  # type: ignore[unreachable]

    @property
    def is_async(self) -> bool:
        """True for `async def` handlers."""
        return inspect.iscoroutinefunction(self.fn)

    def info(self) -> ActorInfo:
        """The declaration as sent to the supervisor, with its payload's type when typed."""
        schema = self.signature.schema()
        return ActorInfo(
            self.name,
            self.timeout,
            self.max_retries,
            self.concurrency,
            self.queue,
            self.priority,
            self.schedule,
            self.rate_limit,
            shape=self.signature.shape(),
            schema=None if schema is None else msgspec.json.encode(schema),
            keyword=self.signature.keyword,
            key_concurrency=self.key_concurrency,
            key_rate_limit=self.key_rate_limit,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the handler directly (handy in unit tests of user code)."""
        return self.fn(*args, **kwargs)

    def options(self, given: JobOptions) -> JobOptions:
        """`given` with this actor's declared defaults filled in where it leaves them out
        (queue, priority, timeout, retries): a job's own fields win over its actor's."""
        declared: dict[str, Any] = {
            "queue": self.queue,
            "priority": self.priority,
            "timeout_seconds": self.timeout,
            "max_retries": self.max_retries,
        }
        merged: dict[str, Any] = {k: v for k, v in declared.items() if v is not None}
        merged.update((k, v) for k, v in given.items() if v is not None)
        return merged  # type: ignore[return-value]

    def payload(self, args: Sequence[Any] = (), kwargs: Mapping[str, Any] | None = None) -> Any:
        """The payload a call with `args` and `kwargs` makes: the handler's own arguments
        by name in the keyword form, else the one payload (`args=(payload,)`)."""
        if self.signature.form is Form.KEYWORD:
            return self.signature.bind(tuple(args), kwargs or {})
        if len(args) > 1 or (args and kwargs) or (kwargs and set(kwargs) != {"payload"}):
            raise TypeError(f"actor {self.name!r} takes its payload whole: args=(payload,)")
        return args[0] if args else (kwargs or {}).get("payload")

    def send(
        self, payload: Any = None, *, client: Producer | None = None, **options: Unpack[JobOptions]
    ) -> JobOut:
        """Enqueue a job of this actor's type: `send_email.send({"to": ...})`. It goes
        through `client`, else the one `goqueue.configure()` (or $GOQUEUE_URL) set up."""
        return self.send_with_options(args=(payload,), client=client, **options)

    async def send_async(
        self,
        payload: Any = None,
        *,
        client: AsyncProducer | None = None,
        **options: Unpack[JobOptions],
    ) -> JobOut:
        """`send` for async code: `await send_email.send_async({"to": ...})`, through
        `client` (an `AsyncClient`), else one per event loop as `goqueue.configure()` set."""
        return await self.send_async_with_options(args=(payload,), client=client, **options)

    def send_with_options(
        self,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        client: Producer | None = None,
        **options: Unpack[JobOptions],
    ) -> JobOut:
        """Enqueue a job with the handler's arguments and job options apart (dramatiq's
        name): `resize.send_with_options(args=(url,), kwargs={"width": 50}, priority=9)`."""
        from goqueue.client import default

        sender = client if client is not None else default.client()
        return sender.enqueue(self.name, self.payload(args, kwargs), **self.options(options))

    async def send_async_with_options(
        self,
        *,
        args: Sequence[Any] = (),
        kwargs: Mapping[str, Any] | None = None,
        client: AsyncProducer | None = None,
        **options: Unpack[JobOptions],
    ) -> JobOut:
        """`send_with_options` for async code."""
        from goqueue.client import default

        sender = client if client is not None else await default.async_client()
        payload = self.payload(args, kwargs)
        return await sender.enqueue(self.name, payload, **self.options(options))


@dataclass(frozen=True, slots=True)
class TypedActor(Actor, Generic[P]):
    """A keyword-form actor: `.send` and `.send_async` take the handler's own arguments
    (`resize.send("https://...", width=50)`), which type checkers see; job options go
    through `.send_with_options`."""

    def send(self, *args: P.args, **kwargs: P.kwargs) -> JobOut:  # type: ignore[override]
        """Enqueue a job with these arguments, through the client `goqueue.configure()`
        (or $GOQUEUE_URL) set up."""
        return self.send_with_options(args=args, kwargs=kwargs)

    async def send_async(self, *args: P.args, **kwargs: P.kwargs) -> JobOut:  # type: ignore[override]
        """`send` for async code."""
        return await self.send_async_with_options(args=args, kwargs=kwargs)


class _Declare(Protocol):
    """What `@actor(...)` returns: the classic form makes an `Actor`, any other signature
    a `TypedActor` whose `.send` takes the handler's parameters (a leading context left
    out)."""

    @overload
    def __call__(self, fn: Callable[[Any, Context], Any], /) -> Actor: ...
    @overload
    def __call__(self, fn: Callable[Concatenate[Context, P], Any], /) -> TypedActor[P]: ...
    @overload
    def __call__(self, fn: Callable[P, Any], /) -> TypedActor[P]: ...


def actor(name: str | None = None, **options: Any) -> _Declare:
    """Declare a handler: `@actor("email", timeout=30, max_retries=3, concurrency=4)`.

    Unknown or invalid options, and a signature no form fits, raise ActorDefinitionError
    at import time.
    """
    if callable(name):
        raise ActorDefinitionError("use @actor(...) with parentheses, e.g. @actor('email')")
    _check_options(name, options)

    def wrap(fn: Handler) -> Actor:
        actor_name = name or fn.__name__
        if not _NAME.fullmatch(actor_name):
            raise ActorDefinitionError(
                f"actor name {actor_name!r} must be 1-200 characters of letters, digits, _.:-"
            )
        signature = read(fn, actor_name)
        kind = TypedActor if signature.form is Form.KEYWORD else Actor
        return kind(actor_name, fn, **options, signature=signature)

    return wrap  # type: ignore[return-value]


def _check_options(name: str | None, options: Mapping[str, Any]) -> None:
    label = f"@actor({name!r})"
    for key, value in options.items():
        if key not in _OPTIONS:
            close = difflib.get_close_matches(key, _OPTIONS, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ActorDefinitionError(
                f"{label}: unknown option {key!r}{hint} (known: {', '.join(_OPTIONS)})"
            )
        if value is None:
            continue
        if key == "timeout":
            ok = isinstance(value, int | float) and not isinstance(value, bool) and value > 0
            if not ok:
                raise ActorDefinitionError(f"{label}: timeout must be a positive number")
        elif key == "queue":
            if not isinstance(value, str) or not _NAME.fullmatch(value):
                raise ActorDefinitionError(
                    f"{label}: queue must be 1-200 characters of letters, digits, _.:-"
                )
        elif key in ("schedule", "rate_limit", "key_rate_limit"):
            _check_timing(label, key, value)
        elif key == "priority":
            ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10
            if not ok:
                raise ActorDefinitionError(f"{label}: priority must be an integer from 0 to 10")
        else:
            low = 0 if key == "max_retries" else 1
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ActorDefinitionError(f"{label}: {key} must be an integer >= {low}")


def _check_timing(label: str, key: str, value: object) -> None:
    """`schedule` and `rate_limit`. Of a cron expression only the shape: a worker loads
    no cron parser; the supervisor checks the expression itself and leaves a bad one
    out, naming the actor."""
    if key in ("rate_limit", "key_rate_limit"):
        if not isinstance(value, str) or not _RATE.fullmatch(value):
            raise ActorDefinitionError(
                f'{label}: {key} must be N/s, N/m or N/h (as "100/s"), got {value!r}'
            )
        return
    fields = value.split() if isinstance(value, str) else []
    if len(fields) != 5 or not all(_CRON_FIELD.fullmatch(f) for f in fields):
        raise ActorDefinitionError(
            f"{label}: schedule must be a five-field cron expression "
            f"(minute hour day month weekday), got {value!r}"
        )


class Registry(dict[str, Actor]):
    """Actors by name."""

    def infos(self) -> list[ActorInfo]:
        """Every actor's declaration, for the Ready message."""
        return [a.info() for a in self.values()]


def load_actors(modules: Iterable[str]) -> Registry:
    """Import `modules` and collect the actors they define (a reload boots a new worker
    process, so each worker imports its modules once).

    Raises ActorDefinitionError for a module without actors or a name defined twice.
    """
    registry = Registry()
    for module_name in modules:
        module = importlib.import_module(module_name)
        found = [v for v in vars(module).values() if isinstance(v, Actor)]
        if not found:
            raise ActorDefinitionError(f"module {module_name!r} defines no @actor handlers")
        for item in found:
            other = registry.get(item.name)
            if other is not None and other.fn is not item.fn:
                raise ActorDefinitionError(
                    f"actor {item.name!r} is defined twice ({module_name!r} and an earlier module)"
                )
            registry[item.name] = item
    return registry
