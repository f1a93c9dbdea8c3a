"""The stores' shared retry of a decision whose lock changed hands (stores/retry.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dedup_jobs.exceptions import StoreUnavailable
from dedup_jobs.stores.retry import AGAIN, ATTEMPTS, changed_hands, decide


def attempts(*answers: Any) -> tuple[list[int], Any]:
    """An attempt answering ``answers`` in turn (an exception is raised), and its call count."""
    calls: list[int] = []

    def attempt() -> Any:
        calls.append(1)
        answer = answers[len(calls) - 1]
        if isinstance(answer, Exception):
            raise answer
        return answer

    return calls, attempt


def test_five_attempts() -> None:
    """The limit every store had spelled out (5) is the one constant now."""
    assert ATTEMPTS == 5


@pytest.mark.parametrize("answer", ["taken", False, None, 0, ()])
def test_the_first_answer_goes_through(answer: Any) -> None:
    """Any answer but AGAIN ends the retry, falsy ones too (an undo answers False)."""
    calls, attempt = attempts(AGAIN, AGAIN, answer, "never asked")
    assert decide("locks", "k", attempt) is answer
    assert len(calls) == 3


def test_the_last_attempt_may_answer() -> None:
    calls, attempt = attempts(*[AGAIN] * (ATTEMPTS - 1), "taken")
    assert decide("locks", "k", attempt) == "taken"
    assert len(calls) == ATTEMPTS


def test_gives_up_after_the_limit() -> None:
    calls, attempt = attempts(*[AGAIN] * (ATTEMPTS + 3))
    with pytest.raises(StoreUnavailable) as raised:
        decide("locks", "t:job:1", attempt)
    assert len(calls) == ATTEMPTS
    assert raised.value.store == "locks"
    assert raised.value.error == "lock 't:job:1' changed hands 5 times in a row"
    assert "lock 't:job:1' changed hands 5 times in a row" in str(raised.value)


def test_the_message_names_the_kind_and_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The number in the message is the constant's, not a literal."""
    from dedup_jobs.stores import retry

    monkeypatch.setattr(retry, "ATTEMPTS", 2)
    calls, attempt = attempts(AGAIN, AGAIN, "never asked")
    with pytest.raises(StoreUnavailable) as raised:
        decide("db", "t:k", attempt, kind="throttle key")
    assert len(calls) == 2
    assert raised.value.error == "throttle key 't:k' changed hands 2 times in a row"
    assert changed_hands("db", "t:k").error == "lock 't:k' changed hands 2 times in a row"


def test_what_an_attempt_raises_ends_the_retry() -> None:
    """A late dispatch (S7) or a store error raised in an attempt is not retried."""
    late = StoreUnavailable("db", "past its deadline")
    calls, attempt = attempts(AGAIN, late, "never asked")
    with pytest.raises(StoreUnavailable) as raised:
        decide("db", "k", attempt)
    assert raised.value is late
    assert len(calls) == 2
