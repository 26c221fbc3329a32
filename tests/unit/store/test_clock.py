"""The Redis clock: this process's monotonic clock plus its measured offset from
Redis's, on fake clocks."""

from __future__ import annotations

from dynamic_batching.store.clock import RETRY_S, RedisClock


class Fake:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_redis_time_is_read_once_and_followed_on_the_monotonic_clock() -> None:
    mono, redis = Fake(0.0), Fake(1011.0)
    clock = RedisClock(redis, monotonic=mono)
    assert clock.now() == 1011.0 and clock.base == 1011.0
    mono.t += 5
    assert clock.now() == 1016.0  # no new read within the refresh period


def test_the_round_trip_is_split_in_the_middle() -> None:
    mono = Fake(0.0)

    def redis_time() -> float:
        mono.t += 0.002  # a 4 ms round trip: Redis answered at its middle
        value = 100.0
        mono.t += 0.002
        return value

    clock = RedisClock(redis_time, monotonic=mono)
    clock.now()
    assert abs(clock.base - (100.0 - 0.002)) < 1e-9


def test_the_offset_is_measured_again_after_the_refresh_period() -> None:
    mono, redis = Fake(0.0), Fake(70.0)
    clock = RedisClock(redis, monotonic=mono, refresh_s=30)
    clock.now()
    mono.t = 29.9
    redis.t = 200.0  # Redis's clock was stepped meanwhile
    assert clock.now() == 70.0 + 29.9
    mono.t = 30.0
    assert clock.now() == 200.0


def test_an_unreachable_redis_keeps_the_last_offset() -> None:
    mono = Fake(0.0)
    answers = iter([5.0])

    def flaky() -> float:
        return next(answers)  # StopIteration the second time: "unreachable"

    clock = RedisClock(flaky, monotonic=mono, refresh_s=1)
    assert clock.now() == 5.0
    mono.t = 2.0
    assert clock.now() == 7.0 and clock.base == 5.0


def test_finding_10_a_reading_with_a_long_round_trip_is_dropped() -> None:
    # Issue 41, finding 10: after an outage the shared client retries TIME, and the
    # answer comes back seconds after Redis read it. Split in the middle, that put the
    # clock seconds off: in-time requests failed, live heartbeats looked stale.
    mono = Fake(0.0)
    readings = iter([(1000.0, 0.001), (1100.0, 3.0), (1200.0, 0.001)])

    def redis_time() -> float:
        value, round_trip = next(readings)
        mono.t += round_trip  # Redis read its clock at the start, answered at the end
        return value

    clock = RedisClock(redis_time, monotonic=mono, refresh_s=30)
    assert abs(clock.now() - 1000.0) < 0.01
    mono.t = 100.0
    # The retried reading (3 s round trip) is dropped: still the first offset.
    assert abs(clock.now() - (1000.0 + 100.0 + 3.0)) < 0.01
    # Tried again soon, not a whole refresh later.
    mono.t += RETRY_S
    assert abs(clock.now() - 1200.0) < 0.01


def test_finding_10_a_step_of_the_hosts_wall_clock_moves_nothing(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import time

    mono = Fake(0.0)
    clock = RedisClock(Fake(500.0), monotonic=mono)
    assert clock.now() == 500.0
    monkeypatch.setattr(time, "time", lambda: 10_000_000.0)  # NTP stepped the host's clock
    mono.t = 1.0
    assert clock.now() == 501.0
