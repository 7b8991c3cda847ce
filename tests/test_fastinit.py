"""``fast_frozen_init``: the hot dataclasses keep dataclasses' own behaviour."""

from __future__ import annotations

import dataclasses
import inspect
import pickle

import pytest

from sluice import InvalidRequestError, Request, Result, Usage
from sluice._fastinit import fast_frozen_init, maker
from sluice._models import Timings
from sluice._ratelimit import RateLimitSnapshot
from sluice.providers import Reply


def _plain_twin(cls: type) -> type:
    """The same fields as a dataclass with dataclasses' own __init__."""
    spec = [(f.name, f.type, f) for f in dataclasses.fields(cls)]
    rebuilt = [
        (n, t, dataclasses.field(default=f.default, default_factory=f.default_factory, init=f.init)) for n, t, f in spec
    ]
    for i, (n, t, f) in enumerate(rebuilt):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            rebuilt[i] = (n, t, dataclasses.field(init=f.init))
    return dataclasses.make_dataclass(cls.__name__, rebuilt, frozen=True, slots=True)


@pytest.mark.parametrize("cls", [Request, Usage, Timings, Result, Reply, RateLimitSnapshot])
def test_the_signature_is_the_one_dataclasses_writes(cls: type) -> None:
    ours = inspect.signature(cls).parameters
    theirs = inspect.signature(_plain_twin(cls)).parameters
    assert list(ours) == list(theirs)
    for name, parameter in ours.items():
        default = theirs[name].default
        if repr(default) == "<factory>":
            assert repr(parameter.default) == "<factory>"
        else:
            assert parameter.default == default


def test_instances_stay_frozen_equal_hashable_and_picklable() -> None:
    usage = Usage(3, 4, reasoning_tokens=1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        usage.input_tokens = 5  # type: ignore[misc]
    assert usage == Usage(3, 4, 0, 1, 0)
    assert hash(usage) == hash(Usage(3, 4, 0, 1, 0))
    assert pickle.loads(pickle.dumps(usage)) == usage
    assert dataclasses.replace(usage, output_tokens=9) == Usage(3, 9, 0, 1, 0)


def test_default_factories_give_each_instance_its_own() -> None:
    first, second = Request("m", [{"role": "user", "content": "x"}]), Request("m", [{"role": "user", "content": "x"}])
    assert first.params == {}
    assert first.params is not second.params
    assert Result(None).usage == Usage()
    assert Result(None).timings == Timings()
    assert first._key is None  # init=False field: its default set


def test_post_init_still_validates() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens must be a positive integer"):
        Request("m", [{"role": "user", "content": "x"}], max_tokens=0)
    with pytest.raises(TypeError):
        Request("m")  # type: ignore[call-arg]


def test_it_refuses_what_it_does_not_handle() -> None:
    @dataclasses.dataclass
    class Loose:
        a: int = 0

    with pytest.raises(TypeError, match="not a frozen, slotted dataclass"):
        fast_frozen_init(Loose)

    @dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
    class KeywordOnly:
        a: int = 0

    with pytest.raises(TypeError, match="keyword-only"):
        fast_frozen_init(KeywordOnly)


@pytest.mark.parametrize("cls", [Usage, Timings, Result])
def test_an_instance_is_of_its_class_once_made(cls: type) -> None:
    made = cls() if cls is not Result else cls(None)
    assert type(made) is cls
    field = dataclasses.fields(made)[-1].name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, field, 1)  # the open twin's plain assignment went with it
    with pytest.raises(dataclasses.FrozenInstanceError):
        delattr(made, field)


def test_a_subclass_keeps_its_class_and_its_fields() -> None:
    class Mine(Usage):
        __slots__ = ()

        def doubled(self) -> int:
            return 2 * self.total_tokens

    mine = Mine(3, 4, reasoning_tokens=1)
    assert type(mine) is Mine
    assert (mine.input_tokens, mine.output_tokens, mine.reasoning_tokens, mine.doubled()) == (3, 4, 1, 14)
    with pytest.raises(dataclasses.FrozenInstanceError):
        mine.input_tokens = 5  # type: ignore[misc]


def test_a_failing_default_factory_leaves_nothing_half_made() -> None:
    @fast_frozen_init
    @dataclasses.dataclass(frozen=True, slots=True)
    class Flaky:
        a: int = 0
        b: list[int] = dataclasses.field(default_factory=lambda: [1 // 0])

    with pytest.raises(ZeroDivisionError):
        Flaky()
    made = Flaky(1, [2])
    assert type(made) is Flaky
    assert made == Flaky(1, [2])


@pytest.mark.parametrize("cls", [Request, Usage, Timings, Result, Reply, RateLimitSnapshot])
def test_a_maker_makes_what_the_class_makes(cls: type) -> None:
    make = maker(cls)
    arguments: dict[str, object] = {
        Request: {"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 3, "id": "r"},
        Usage: {"input_tokens": 3, "output_tokens": 4, "reasoning_tokens": 1},
        Timings: {"queued": 0.5, "total": 2.0},
        Result: {"request": None, "text": "t", "attempts": 2, "cost_usd": 0.25},
        Reply: {"text": "t", "usage": Usage(1, 2), "request_id": "q"},
        RateLimitSnapshot: {"limit_requests": 500.0, "remaining_tokens": 9.0, "tokens_window": 1.0},
    }[cls]
    made, constructed = make(**arguments), cls(**arguments)
    assert type(made) is cls
    for field in dataclasses.fields(cls):
        assert getattr(made, field.name) == getattr(constructed, field.name), field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(made, dataclasses.fields(cls)[0].name, None)


def test_a_maker_validates_and_refuses_a_class_it_does_not_know() -> None:
    with pytest.raises(InvalidRequestError, match="max_tokens must be a positive integer"):
        maker(Request)("m", [{"role": "user", "content": "x"}], max_tokens=0)
    first, second = maker(Result)(None), maker(Result)(None)
    assert first.usage == Usage()
    assert first.timings is not second.timings  # each its own default
    with pytest.raises(TypeError, match="did not go through fast_frozen_init"):
        maker(dataclasses.make_dataclass("Plain", ["a"], frozen=True, slots=True))
