"""The device lock: one batch on the device at a time, re-entrant, and lent by the
batch holding it to one waiting in the worker's other thread (gpu_workers/device_lock.py).
Threads meet on the lock's own state."""

from __future__ import annotations

import threading

import pytest
from polling import poll_until

from dynamic_batching.gpu_workers.device_lock import DeviceLock

T = 5.0


def test_re_entrant_and_one_holder_at_a_time() -> None:
    lock = DeviceLock()
    order: list[str] = []
    with lock, lock:
        t = threading.Thread(target=lambda: (lock.acquire(), order.append("other"), lock.release()))
        t.start()
        poll_until(lambda: lock.wanted, "a waiter", timeout=T)
        order.append("holder")
    t.join(T)
    assert order == ["holder", "other"]
    assert not lock.wanted


def test_lend_with_nobody_waiting_returns_at_once() -> None:
    lock = DeviceLock()
    with lock:
        assert lock.lend() is False
    with pytest.raises(RuntimeError, match="does not hold"):
        lock.release()


def test_the_holder_lends_it_between_layers_and_gets_it_back_before_any_other_waiter() -> None:
    lock = DeviceLock()
    order: list[str] = []
    borrower_in = threading.Event()
    go_on = threading.Event()

    def borrower() -> None:
        with lock, lock:  # its batch, and its model call inside it
            order.append("borrower runs")
            borrower_in.set()
            go_on.wait(T)

    def third() -> None:
        with lock:
            order.append("third")

    b, t3 = threading.Thread(target=borrower), threading.Thread(target=third)

    def meanwhile() -> None:
        # While the borrower has the device, a third batch starts waiting for it.
        borrower_in.wait(T)
        t3.start()
        poll_until(lambda: lock.waiting == 1, "the third waiter", timeout=T)
        go_on.set()

    helper = threading.Thread(target=meanwhile)
    with lock, lock:  # a batch, and its model call
        b.start()
        poll_until(lambda: lock.wanted, "a waiter", timeout=T)
        helper.start()
        # Between two layers: lend, and resume once the borrower is done.
        assert lock.lend() is True
        order.append("lender resumes")
    for t in (helper, b, t3):
        t.join(T)
    assert order == ["borrower runs", "lender resumes", "third"]


def test_a_release_lets_go_of_the_gil_once_when_a_batch_waits_for_the_device() -> None:
    """So that the waiting batch starts on the device now, not when the releaser, busy
    writing its answers, next lets go of the GIL."""
    yields: list[int] = []
    lock = DeviceLock(yield_gil=lambda: yields.append(1))
    with lock, lock:  # re-entrant: only the outer release hands the device on
        pass
    assert yields == []  # nobody waiting
    took: list[str] = []
    t = threading.Thread(target=lambda: (lock.acquire(), took.append("waiter"), lock.release()))
    with lock:
        t.start()
        poll_until(lambda: lock.wanted, "a waiter", timeout=T)
    t.join(T)
    assert took == ["waiter"] and yields == [1]


def test_a_batch_on_a_cpu_device_hands_it_on_without_letting_go_of_the_gil() -> None:
    yields: list[int] = []
    lock = DeviceLock(yield_gil=lambda: yields.append(1))
    t = threading.Thread(target=lambda: (lock.acquire(), lock.release()))
    with lock:
        lock.hand_on_gil = False
        t.start()
        poll_until(lambda: lock.wanted, "a waiter", timeout=T)
    t.join(T)
    assert yields == []
