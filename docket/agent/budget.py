"""The reference agent's retry budget: retries kept within a share of its first attempts.

Pure: the agent tells it each first attempt and asks it before each retry; it
answers from its counts alone (no clock, no I/O).

A token bucket, in the form Finagle's RetryBudget and tower's retry Budget give
it: every first attempt deposits `ratio` of a token (0.1: one retry per ten
calls), every retry withdraws a whole one, and a retry is taken only while a
whole token is there. The SRE book's client-side rule is the same share (retries
at most 10% of requests per client). A run starts with `floor` tokens so that its
first failures can still be retried before any deposit has built up; Finagle and
tower grant that reserve per second over a ten-second window (minRetriesPerSec,
ttl). Here it is per run, and deposits do not expire: a reference agent's run is
short, and `docket explain` and the game day judge a whole ledger, whose
arithmetic is then the same one line: retries <= ratio * first attempts + floor.

Holding exact counts instead of a float balance keeps that line exact: the
balance is floor + ratio * first_attempts - retries, in Fractions.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

DEFAULT_RATIO = Fraction(1, 10)  # a retry per ten first attempts
DEFAULT_FLOOR = 3  # retries a run may always take, deposits or not
RATIO_DENOMINATOR = 1000  # a ratio is read to three decimals


def ratio_from(value: float | Fraction) -> Fraction:
    """A ratio as the budget holds it: exact, to three decimals (0.1 is 1/10, not the
    binary float just above it)."""
    return Fraction(value).limit_denominator(RATIO_DENOMINATOR)


def allowance(first_attempts: int, ratio: Fraction = DEFAULT_RATIO, floor: int = DEFAULT_FLOOR):
    """The most retries a run of `first_attempts` first attempts may take."""
    return floor + ratio * first_attempts


@dataclass
class RetryBudget:
    ratio: Fraction = DEFAULT_RATIO
    floor: int = DEFAULT_FLOOR
    first_attempts: int = 0
    retries: int = 0  # withdrawals granted
    refused: int = 0  # withdrawals refused: a retry the budget did not allow

    def __post_init__(self) -> None:
        if not 0 <= self.ratio <= 1:
            raise ValueError(f"retry ratio must be from 0 to 1, not {float(self.ratio)!r}")
        if self.floor < 0:
            raise ValueError(f"retry floor must be at least 0, not {self.floor!r}")

    @property
    def balance(self) -> Fraction:
        return allowance(self.first_attempts, self.ratio, self.floor) - self.retries

    def deposit(self) -> None:
        """A first attempt was made."""
        self.first_attempts += 1

    def allows(self) -> bool:
        """Would a retry be allowed now (nothing spent)?"""
        return self.balance >= 1

    def withdraw(self) -> bool:
        """May a retry be made now? Yes spends a token; no is counted as refused."""
        if self.allows():
            self.retries += 1
            return True
        self.refused += 1
        return False

    def summary(self) -> dict:
        return {
            "ratio": float(self.ratio),
            "floor": self.floor,
            "first_attempts": self.first_attempts,
            "retries": self.retries,
            "refused": self.refused,
        }
