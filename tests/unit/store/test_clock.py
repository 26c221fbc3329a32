"""The Redis clock: this host's clock plus its measured offset, on fake clocks."""

from __future__ import annotations

from dynamic_batching.store.clock import RedisClock


class Fake:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_a_host_eleven_seconds_slow_reads_redis_time() -> None:
    host, mono, redis = Fake(1000.0), Fake(0.0), Fake(1011.0)
    clock = RedisClock(redis, local=host, monotonic=mono)
    assert clock.now() == 1011.0 and clock.offset == 11.0
    host.t += 5
    assert clock.now() == 1016.0  # no new read within the refresh period


def test_the_round_trip_is_split_in_the_middle() -> None:
    host = Fake(0.0)

    def redis_time() -> float:
        host.t += 0.002  # a 4 ms round trip: Redis answered at its middle
        value = 100.0
        host.t += 0.002
        return value

    clock = RedisClock(redis_time, local=host, monotonic=Fake(0.0))
    clock.now()
    assert abs(clock.offset - (100.0 - 0.002)) < 1e-9


def test_the_offset_is_measured_again_after_the_refresh_period() -> None:
    host, mono, redis = Fake(0.0), Fake(0.0), Fake(70.0)
    clock = RedisClock(redis, local=host, monotonic=mono, refresh_s=30)
    clock.now()
    redis.t = 40.0  # the host's clock was stepped by NTP meanwhile
    mono.t = 29.9
    assert clock.offset == 70.0 and clock.now() == 70.0
    mono.t = 30.0
    assert clock.now() == 40.0


def test_an_unreachable_redis_keeps_the_last_offset() -> None:
    host, mono = Fake(0.0), Fake(0.0)
    answers = iter([5.0])

    def flaky() -> float:
        return next(answers)  # StopIteration the second time: "unreachable"

    clock = RedisClock(flaky, local=host, monotonic=mono, refresh_s=1)
    assert clock.now() == 5.0
    mono.t = 2.0
    assert clock.now() == 5.0 and clock.offset == 5.0
