"""The stream gate (csrc/guard/device/StreamGate.h): what holds a stream backend's
results on the device until check="verify" has its verdict, through ``_C._StreamGate``.

The host half runs everywhere; the CUDA half (a kernel on the current stream,
waiting on a word in pinned host memory) runs on a GPU, in ``scripts/gpu.sh``.

The CUDA cases run every kernel they enqueue behind a held stream once before
holding it. With CUDA's lazy module loading (the default), the first launch of a
kernel not yet loaded blocked the launching thread while a gate kernel spun: in
the first GPU run a test that launched ``x * 2`` behind the gate and released it
from the same thread afterwards hung. In the guard the release comes from the
verifier's thread, so there it is a stall until the verdict, not a hang
(docs/architecture.md, "The device path").
Through the guard, on nccl_sim: tests/python/test_device_path.py.
"""
from __future__ import annotations

import math
import time

import pytest
import torch

from torch_ext import _C


def cuda(fn):
    """A CUDA case: one GPU, and a bound well under a device session's minutes."""
    return pytest.mark.gpu(count=1)(pytest.mark.timeout(60)(fn))


def _nan(t: torch.Tensor) -> bool:
    return bool(torch.isnan(t.float()).all())


def test_a_held_cpu_result_is_kept_or_filled_by_the_verdict():
    g = _C._StreamGate()
    a, b = torch.ones(4), torch.ones(4, dtype=torch.float64)
    i, h = torch.ones(3, dtype=torch.int64), torch.ones(2, dtype=torch.float16)
    assert g.hold(1, [a]) and g.hold(2, [b, i]) and g.hold(3, [h])
    g.release(1)
    assert g.word == 1 and a.tolist() == [1.0] * 4
    g.poison(2)
    assert g.word == 2**63 | 2
    assert _nan(b) and _nan(h) and i.tolist() == [-(2**63)] * 3
    g.release(5)  # a round that ended after the failure changes nothing
    assert g.word == 2**63 | 2
    assert not g.hold(1, [a])  # its verdict is in: nothing held
    assert a.tolist() == [1.0] * 4


def _passes(event: torch.cuda.Event, gates, seconds: float = 10.0) -> None:
    """The event behind the gate completes within `seconds` of its verdict; if not,
    every gate is poisoned (so no kernel is left spinning) and the test fails."""
    end = time.monotonic() + seconds
    while not event.query():
        if time.monotonic() > end:
            for g in gates:
                g.poison(1)
            torch.cuda.synchronize()
            pytest.fail(f"the held stream did not pass within {seconds} s of its release "
                        f"(gate words: {[hex(g.word) for g in gates]})")


def _stream_is_held(event: torch.cuda.Event, seconds: float) -> bool:
    """The event after the gate stays pending for `seconds` (the host is never blocked)."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if event.query():
            return False
    return True


@cuda
def test_cuda_the_current_stream_waits_for_the_release_and_the_host_does_not():
    available, why = _C._cuda_gate_available()
    assert available, why
    g = _C._StreamGate()
    x = torch.full((1024,), 3.0, device="cuda")
    _ = x * 2  # loaded before the gate (see the module's docstring)
    torch.cuda.synchronize()
    t0 = time.monotonic()
    assert g.hold(2, [x])
    y = x * 2  # enqueued behind the gate
    done = torch.cuda.Event()
    done.record()
    assert time.monotonic() - t0 < 1.0  # enqueued, not waited for
    assert _stream_is_held(done, 0.2)
    g.release(1)  # not yet this one
    assert _stream_is_held(done, 0.2)
    g.release(2)
    _passes(done, [g])
    assert y.sum().item() == 6.0 * 1024 and x.sum().item() == 3.0 * 1024
    # A hold whose verdict is in launches nothing.
    assert not g.hold(2, [x])


@cuda
def test_cuda_a_poisoned_result_is_filled_before_any_later_kernel_reads_it():
    g = _C._StreamGate()
    g.release(3)
    dtypes = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64]
    kept = torch.ones(8, device="cuda")
    outs = [torch.ones(1 << 20, dtype=d, device="cuda") for d in dtypes]  # 6 regions: two launches
    torch.stack([o[:4].double() for o in outs]).sum()  # loaded before the gate
    torch.cuda.synchronize()
    assert g.hold(3, [kept])
    assert g.hold(4, outs)
    total = torch.stack([o[:4].double() for o in outs]).sum()  # a kernel reading the results
    done = torch.cuda.Event()
    done.record()
    assert _stream_is_held(done, 0.2)
    g.poison(4)
    _passes(done, [g])
    assert kept.sum().item() == 8.0
    for o in outs[:4]:
        assert _nan(o), o.dtype
    assert bool((outs[4] == torch.iinfo(torch.int32).min).all())
    assert bool((outs[5] == torch.iinfo(torch.int64).min).all())
    assert math.isnan(total.item())  # what read them read the fill, never the data


@cuda
def test_cuda_words_of_many_gates_and_holds_on_other_streams():
    gates = [_C._StreamGate() for _ in range(600)]  # more than one pinned page of words
    s = torch.cuda.Stream()
    x = torch.ones(4, device="cuda")
    with torch.cuda.stream(s):
        for k, g in enumerate(gates):
            assert g.hold(k + 1, [x])
        done = torch.cuda.Event()
        done.record(s)
    assert _stream_is_held(done, 0.1)
    for k, g in enumerate(gates):
        g.release(k + 1)
    _passes(done, gates)
    assert x.sum().item() == 4.0
