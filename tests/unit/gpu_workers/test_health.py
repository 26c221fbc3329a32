"""A device's circuit opens for errors that blame the device, never for inputs that
each fail on their own."""

from __future__ import annotations

from dynamic_batching.core.errors import InferenceError
from dynamic_batching.gpu_workers.health import device_failed


def own(msg: str) -> InferenceError:
    return InferenceError(f"model failed on this input: {msg}")


def test_inputs_failing_on_their_own_are_not_a_device_fault() -> None:
    assert not device_failed([own("PoisonInput: a"), own("PoisonInput: b"), own("ValueError: c")])
    assert not device_failed([own("PoisonInput: only one")])


def test_fifty_all_failing_batches_never_look_like_a_device_fault() -> None:
    assert not any(device_failed([own(f"PoisonInput: batch {b} input {i}") for i in range(4)]) for b in range(50))


def test_errors_that_name_the_device_are_a_device_fault() -> None:
    assert device_failed([own("OutOfMemoryError: CUDA out of memory")])
    assert device_failed([own("DeviceFault: the simulated device is broken")] * 3)
    assert device_failed([own("RuntimeError: CUDA error: device-side assert triggered")])


def test_a_batch_with_any_success_is_healthy() -> None:
    assert not device_failed([own("CUDA error"), [0.1, 0.2]])
    assert not device_failed([])
