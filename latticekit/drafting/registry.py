"""The one table of drafting strategies: method name -> :class:`~latticekit.drafting.protocol.Drafter` class.

A drafter class declares its method, defaults and knobs as class attributes and registers
itself with :func:`register`; :class:`~latticekit.drafting.config.DecoderConfig` validates a
config through :func:`lookup`, and every loop (decode, eval, the CLI) builds drafters with
:func:`~latticekit.drafting.protocol.make_drafter`. The built-in drafters (:mod:`latticekit.drafting.drafters`) register when
:mod:`latticekit.drafting` is imported. A new strategy is one class, in any module::

    @register
    class Mine(Drafter):
        method = "mine"
        knobs = frozenset({"p"})
        def draft(self, step): ...

This module imports nothing of latticekit's drafting, not even for type checking: the protocol,
the config and the drafters import it. What it reads of a class is :class:`Strategy`.
"""

from __future__ import annotations

from typing import ClassVar, Protocol, TypeVar

from latticekit.errors import DecoderConfigError

__all__ = ["Strategy", "register", "unregister", "lookup", "methods"]


class Strategy(Protocol):
    """The declaration of a drafting strategy that the table and the config read: what every
    :class:`~latticekit.drafting.protocol.Drafter` subclass declares."""

    method: ClassVar[str]
    default_k: ClassVar[int]
    default_p: ClassVar[int]
    knobs: ClassVar[frozenset[str]]
    samples: ClassVar[bool]


_DRAFTERS: dict[str, type[Strategy]] = {}
_KNOBS = frozenset({"k", "p", "alpha", "lm"})

D = TypeVar("D", bound=type[Strategy])


def register(cls: D) -> D:
    """Adds a drafter class under its ``method`` (a class decorator); returns the class.

    Raises:
        DecoderConfigError: no method name, knobs outside k/p/alpha/lm, bad defaults, or the
            name taken by another class.
    """
    name = getattr(cls, "method", "")
    if not isinstance(name, str) or not name or ":" in name or "," in name or name != name.strip():
        raise DecoderConfigError(f"drafter {cls.__name__} needs a method name (no ':' or ','), got {name!r}")
    unknown = set(cls.knobs) - _KNOBS
    if unknown:
        raise DecoderConfigError(f"drafter {cls.__name__} declares unknown knobs {sorted(unknown)}; "
                                 f"a DecoderConfig has {sorted(_KNOBS)}")
    for knob in ("default_k", "default_p"):
        value = getattr(cls, knob)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DecoderConfigError(f"drafter {cls.__name__}: {knob} must be an integer >= 1, got {value!r}")
    if cls.default_p != 1 and "p" not in cls.knobs:
        raise DecoderConfigError(f"drafter {cls.__name__} has default_p={cls.default_p} but does not read p")
    held = _DRAFTERS.get(name)
    if held is not None and held is not cls:
        raise DecoderConfigError(f"method {name!r} is taken by {held.__module__}.{held.__qualname__}")
    _DRAFTERS[name] = cls
    return cls


def unregister(method: str) -> None:
    """Removes a registered method (a test's or plugin's drafter); unknown names are ignored."""
    _DRAFTERS.pop(method, None)


def lookup(method: str) -> type[Strategy]:
    """The drafter class of ``method``.

    Raises:
        DecoderConfigError: no drafter registered that method.
    """
    try:
        return _DRAFTERS[method]
    except (KeyError, TypeError):
        raise DecoderConfigError(f"unknown method {method!r}; expected one of {methods()}") from None


def methods() -> tuple[str, ...]:
    """The registered methods, in registration order (the built-ins first)."""
    return tuple(_DRAFTERS)
