"""The clock: the monotonic reading never goes back; ts is RFC 3339 UTC."""

from datetime import datetime

from hypothesis import given
from hypothesis import strategies as st

from docket.clock import Clock, FakeClock, rfc3339


def test_rfc3339_is_utc_with_milliseconds():
    assert rfc3339(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339(1_800_000_000.1234) == "2027-01-15T08:00:00.123Z"
    datetime.strptime(rfc3339(Clock().wall()), "%Y-%m-%dT%H:%M:%S.%fZ")


@given(st.lists(st.floats(min_value=-3600, max_value=3600, allow_nan=False), max_size=50))
def test_monotonic_reading_never_decreases_whatever_the_steps(steps):
    clock = FakeClock()
    last = clock.mono()
    for step in steps:
        clock.advance(step)
        now = clock.mono()
        assert now >= last
        last = now


def test_backward_step_is_clamped_then_time_resumes():
    clock = FakeClock(mono=100.0)
    assert clock.mono() == 100.0
    clock.advance(-30)
    assert clock.mono() == 100.0  # clamped, not 70
    clock.advance(40)
    assert clock.mono() == 110.0


def test_wall_step_does_not_move_monotonic():
    clock = FakeClock(mono=5.0, wall=1000.0)
    clock.step_wall(-500)
    assert clock.wall() == 500.0 and clock.mono() == 5.0


def test_real_clock_is_monotonic():
    clock = Clock()
    readings = [clock.mono() for _ in range(1000)]
    assert readings == sorted(readings)
