"""Backoff and retry hints are pure functions: tested by tables."""

from __future__ import annotations

import math

import pytest

from sluice import (
    AttemptTimeoutError,
    AuthenticationError,
    BadRequestError,
    CapacityError,
    ConfigError,
    ConnectError,
    InvalidRequestError,
    MalformedResponseError,
    NotFoundError,
    OverloadedError,
    PermissionDeniedError,
    RateLimitError,
    RetryPolicy,
    ServerError,
    SluiceError,
    backoff_delay,
    parse_retry_after,
)
from sluice._errors import error_for_status
from sluice._retry import backoff_ceiling, parse_should_retry


@pytest.mark.parametrize(
    ("attempt", "rand", "hint", "expected"),
    [
        (1, 0.0, None, 0.0),  # full jitter reaches down to zero
        (1, 0.5, None, 0.25),  # base 0.5 * 2**0 * 0.5
        (2, 0.5, None, 0.5),
        (3, 0.999, None, 1.998),
        (10, 1.0, None, 8.0),  # capped
        (10, 0.5, None, 4.0),
        (1, 0.9, 3.0, 3.0),  # the server's hint wins, as given
        (5, 0.9, 0.0, 0.0),
        (2, 0.5, -1.0, 0.5),  # a negative hint is ignored
    ],
)
def test_backoff_table(attempt: int, rand: float, hint: float | None, expected: float) -> None:
    assert backoff_delay(attempt, base=0.5, cap=8.0, hint=hint, rand=lambda: rand) == pytest.approx(expected)


NOW = 1_700_000_000.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({}, None),
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),  # ms wins
        ({"retry-after": "2"}, 2.0),
        ({"retry-after": "0.5"}, 0.5),
        ({"retry-after-ms": "nonsense", "retry-after": "3"}, 3.0),
        ({"retry-after": "-4"}, None),
        ({"retry-after": "Tue, 14 Nov 2023 22:13:50 GMT"}, 30.0),  # NOW + 30 s as an HTTP date
        ({"retry-after": "Tue, 14 Nov 2023 22:12:00 GMT"}, 0.0),  # in the past
        ({"retry-after": "soon"}, None),
        ({"retry-after": ""}, None),
    ],
)
def test_parse_retry_after_table(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers, now=NOW) == expected


@pytest.mark.parametrize(
    ("headers", "expected"),
    [({}, None), ({"x-should-retry": "true"}, True), ({"x-should-retry": "false"}, False)],
)
def test_should_retry_header(headers: dict[str, str], expected: bool | None) -> None:
    assert parse_should_retry(headers) is expected


@pytest.mark.parametrize(
    ("status", "cls", "retryable"),
    [
        (400, BadRequestError, False),
        (401, AuthenticationError, False),
        (403, PermissionDeniedError, False),
        (404, NotFoundError, False),
        (422, BadRequestError, False),
        (408, ServerError, True),
        (409, ServerError, True),
        (429, RateLimitError, True),
        (500, ServerError, True),
        (502, ServerError, True),
        (503, ServerError, True),
        (529, OverloadedError, True),
        (418, type(None), False),
    ],
)
def test_status_classes(status: int, cls: type, retryable: bool) -> None:
    error_cls = error_for_status(status)
    if cls is not type(None):
        assert error_cls is cls
    assert error_cls("x").retryable is retryable


def test_policy_retries_by_class_and_budget() -> None:
    policy = RetryPolicy(max_attempts=3)
    for error in (
        RateLimitError("x"),
        ServerError("x"),
        OverloadedError("x"),
        AttemptTimeoutError("x"),
        ConnectError("x"),
        MalformedResponseError("x"),
    ):
        assert policy.should_retry(error, 1)
        assert not policy.should_retry(error, 3)  # attempts used up
    for error in (BadRequestError("x"), AuthenticationError("x"), InvalidRequestError("x")):
        assert not policy.should_retry(error, 1)
    assert not policy.should_retry(ServerError("x", should_retry=False), 1)  # x-should-retry wins
    assert policy.should_retry(BadRequestError("x", should_retry=True), 1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": 1.5},
        {"base_delay": -1},
        {"deadline": 0},
        {"attempt_timeout": -2},
        {"max_retry_after": -1},
        {"max_retry_after": math.nan},
        {"max_retry_after": "60"},
        {"max_retry_after": True},
        {"base_delay": math.nan},
    ],
)
def test_policy_refuses_nonsense(kwargs: dict[str, float]) -> None:
    with pytest.raises(ConfigError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_error_message_names_status_and_request_id() -> None:
    error = RateLimitError("slow down", status=429, request_id="req_42")
    assert str(error) == "HTTP 429: slow down (request id req_42)"
    assert error.kind == "rate_limited"


def test_policy_accepts_an_unbounded_hint_cap() -> None:
    assert RetryPolicy(max_retry_after=math.inf).max_retry_after == math.inf
    assert RetryPolicy(max_retry_after=0).max_retry_after == 0


@pytest.mark.parametrize(
    ("error", "cap", "expected"),
    [
        (RateLimitError("x"), 60.0, None),  # no hint
        (RateLimitError("x", retry_after=0.0), 60.0, 0.0),  # "now" is a hint
        (RateLimitError("x", retry_after=30.0), 60.0, 30.0),
        (RateLimitError("x", retry_after=60.0), 60.0, 60.0),  # the cap itself is obeyed
        (RateLimitError("x", retry_after=60.5), 60.0, None),
        (RateLimitError("x", retry_after=86_400.0), 60.0, None),  # "come back tomorrow"
        (RateLimitError("x", retry_after=86_400.0), math.inf, 86_400.0),  # opted in
        (RateLimitError("x", retry_after=1.0), 0.0, None),
        (RateLimitError("x", retry_after=math.inf), math.inf, None),  # never a real hint
        (RateLimitError("x", retry_after=math.nan), 60.0, None),
        (RateLimitError("x", retry_after=-1.0), 60.0, None),
        (ServerError("x", retry_after=5.0), 60.0, 5.0),  # a 503 may carry one too
        (CapacityError("x"), 60.0, None),  # not from a provider: no hint
    ],
)
def test_hint_table(error: SluiceError, cap: float, expected: float | None) -> None:
    assert RetryPolicy(max_retry_after=cap).hint(error) == expected


@pytest.mark.parametrize(
    ("retry_after", "attempt", "expected"),
    [
        (3.0, 1, 3.0),  # a hint within the cap wins
        (45.0, 1, 45.0),  # ... even past max_delay: the server knows when it has room
        (0.0, 4, 0.0),
        (None, 1, 0.5),  # no hint: the un-jittered backoff, base * 2**(attempt-1)
        (None, 3, 2.0),
        (86_400.0, 1, 0.5),  # over the cap: as if there were no hint
        (86_400.0, 4, 4.0),
        (86_400.0, 10, 8.0),  # capped at max_delay
        (86_400.0, 5000, 8.0),  # no overflow however many attempts
    ],
)
def test_pause_table(retry_after: float | None, attempt: int, expected: float) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=8.0, max_retry_after=60.0)
    assert policy.pause(RateLimitError("x", retry_after=retry_after), attempt) == expected


@pytest.mark.parametrize(("attempt", "ceiling"), [(1, 0.5), (3, 2.0), (12, 8.0)])
def test_a_hint_over_the_cap_gets_jittered_backoff_not_the_hint(attempt: int, ceiling: float) -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=8.0, max_retry_after=60.0)
    error = RateLimitError("x", retry_after=86_400.0)
    delays = [policy.delay(error, attempt) for _ in range(200)]
    assert all(0.0 <= d < ceiling for d in delays)
    # jittered, so a crowd does not wake together (a spread under half the range has
    # probability ~2**-198)
    assert max(delays) - min(delays) > ceiling / 2
    # within the cap the hint is used as given, without jitter
    assert policy.delay(RateLimitError("x", retry_after=7.0), attempt) == 7.0


@pytest.mark.parametrize(("attempt", "expected"), [(0, 0.5), (1, 0.5), (2, 1.0), (5, 8.0), (6, 10.0), (10**6, 10.0)])
def test_backoff_ceiling_table(attempt: int, expected: float) -> None:
    assert backoff_ceiling(attempt, base=0.5, cap=10.0) == expected
