"""A faster ``__init__`` for the frozen, slotted dataclasses every request makes.

A frozen dataclass's generated ``__init__`` sets each field with
``object.__setattr__(self, name, value)``: a global, an attribute and a call (that packs
its arguments in a tuple) per field, ~0.05 µs a field, and a request makes a Request, a
Usage, two Replies, a Timings and a Result (~60 fields). Here the instance is given,
while it is being made, the class of an *open twin*: a subclass with the same slots that
adds nothing and lets plain assignment through, so each field is one ``self.x = x`` (the
interpreter's specialised slot store), and then its class back: a third of the time for
a 20-field class. (Assigning ``__class__`` between classes of one layout is part of the
data model.) An instance of a subclass of ``cls`` keeps its class, and is set through
each slot's descriptor instead. :func:`maker` gives the same as a function that skips
``type.__call__`` too (which packs keyword arguments in a dict, only to unpack them for
``__init__``): for the hot paths that make a Result or a Reply with a dozen of them.
dataclasses has no option for any of this, hence this by hand. The class stays what it
was: frozen (assignment raises FrozenInstanceError), the same signature, defaults,
default factories and ``__post_init__``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

__all__ = ["fast_frozen_init", "maker"]

T = TypeVar("T")
P = ParamSpec("P")

#: Each class's maker (see :func:`maker`).
_MAKERS: dict[type, Callable[..., Any]] = {}


def maker(cls: Callable[P, T]) -> Callable[P, T]:
    """``cls(...)`` as a plain function: a new instance, made straight as the open twin and
    given its class back, without ``type.__call__`` (``cls`` went through
    :func:`fast_frozen_init`)."""
    try:
        return _MAKERS[cls]  # type: ignore[index]
    except KeyError:
        raise TypeError(f"{cls!r} did not go through fast_frozen_init") from None


def fast_frozen_init(cls: type[T]) -> type[T]:
    """Replace ``cls.__init__`` (a frozen, slotted dataclass, no ``kw_only`` fields)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__} is not a frozen, slotted dataclass")
    scope: dict[str, Any] = {
        "_FACTORY": _FACTORY,
        "_cls": cls,
        "_open": _open_twin(cls),
        "_set": object.__setattr__,
        "_new": object.__new__,
    }
    arguments: list[str] = []
    values: list[tuple[int, str, str]] = []  # (index, field, the expression of its value)
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name} is keyword-only: not supported")
        scope[f"_set{i}"] = cls.__dict__[f.name].__set__
        factory = f.default_factory is not dataclasses.MISSING
        if factory:
            scope[f"_factory{i}"] = f.default_factory
        if f.default is not dataclasses.MISSING:
            scope[f"_default{i}"] = f.default
        if not f.init:
            if f.default is dataclasses.MISSING and not factory:
                continue  # dataclasses leaves it unset too
            values.append((i, f.name, f"_factory{i}()" if factory else f"_default{i}"))
        elif factory:
            arguments.append(f"{f.name}=_FACTORY")
            values.append((i, f.name, f"_factory{i}() if {f.name} is _FACTORY else {f.name}"))
        elif f.default is not dataclasses.MISSING:
            arguments.append(f"{f.name}=_default{i}")
            values.append((i, f.name, f.name))
        else:
            arguments.append(f.name)
            values.append((i, f.name, f.name))
    opened = [f"self.{name} = {value}" for _, name, value in values]
    through_descriptors = [f"_set{i}(self, {value})" for i, _, value in values]
    body = [
        "if type(self) is _cls:",
        "    _set(self, '__class__', _open)",  # past the frozen __setattr__, once
        *(f"    {line}" for line in opened),
        "    self.__class__ = _cls",
        "else:",  # a subclass of cls keeps its own class
        *(f"    {line}" for line in through_descriptors or ["pass"]),
    ]
    made = ["self = _new(_open)", *opened, "self.__class__ = _cls"]
    if hasattr(cls, "__post_init__"):
        body.append("self.__post_init__()")
        made.append("self.__post_init__()")
    signature = ", ".join(arguments)
    exec(f"def __init__(self, {signature}):\n    " + "\n    ".join(body), scope)
    exec(f"def make({signature}):\n    " + "\n    ".join([*made, "return self"]), scope)
    init = scope["__init__"]
    make = scope["make"]
    make.__qualname__ = make.__name__ = f"make_{cls.__name__}"
    make.__module__ = cls.__module__
    _MAKERS[cls] = make
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(getattr(cls.__init__, "__annotations__", {}))
    setattr(cls, "__init__", init)  # noqa: B010 - mypy refuses assigning a method
    return cls


def _open_twin(cls: type) -> type:
    """A subclass of ``cls`` of the same layout whose instances take plain assignment:
    ``object``'s own ``__setattr__`` and ``__delattr__`` (both, so the type's setattr
    slot is the generic C one and the interpreter specialises each store)."""
    twin = type(
        f"_{cls.__name__}Open",
        (cls,),
        {
            "__slots__": (),
            "__setattr__": object.__setattr__,
            "__delattr__": object.__delattr__,
            "__module__": cls.__module__,
        },
    )
    twin.__qualname__ = f"{cls.__qualname__}._Open"
    return twin


class _Factory:
    """The default of a field with a default factory (dataclasses' own is private)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY = _Factory()
