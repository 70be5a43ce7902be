"""Shared fixtures: every test starts with fresh statistics, fresh sessions (no compiled
regions or pass-through decisions carried over from another test) and no leftover mode."""

import os

import pytest
import torch

os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
# Most tests check what capture does from a block's first op, so the suite (and the
# subprocesses it starts) runs with the eager warm-up off (Note [The first iteration
# runs eagerly]); tests/test_warmup.py checks the default, warm-up on.
os.environ["ADAPTIVE_EAGER_WARMUP"] = "0"
# The suite registers the emulated neuron device in its own process (pytest_configure),
# which makes it the accelerator device="auto" would pick (Note [device="auto"]); the
# suite's programs are CPU programs unless a test says otherwise, as on a machine without
# an accelerator. tests/test_devices.py checks "auto" itself.
os.environ["ADAPTIVE_EAGER_DEVICE"] = "cpu"
# The suite's training loops are a few steps long, and its tests of the compiled optimizer
# step check it from its second step: the compile threshold is off (Note [A step compiles
# once it has cost enough]); tests/test_optim_compile.py checks the default.
os.environ["ADAPTIVE_EAGER_OPTIMIZER_STEP_AFTER_MS"] = "0"


@pytest.fixture(autouse=True)
def _private_region_cache(tmp_path_factory, monkeypatch):
    """Each test gets an empty compiled-region cache folder of its own (and its
    subprocesses inherit it), never the user's: a region one test compiled must not be
    loaded by another, and the suite must not fill ~/.cache. A test may set its own."""
    monkeypatch.setenv("ADAPTIVE_EAGER_CACHE_DIR", str(tmp_path_factory.mktemp("ae-cache")))


@pytest.fixture(autouse=True)
def _fresh_state():
    from adaptive_eager import session

    session.clear_sessions()
    session.counters().reset()
    torch.manual_seed(0)
    threads = torch.get_num_threads()
    yield
    # a benchmark's main sets one thread; at one thread the optimizer step's check waits a
    # step for its copies (runtime/step_check.py), so counts of compiled steps depend on it
    torch.set_num_threads(threads)
    _wait_for_compiles(session.counters())
    assert session.current_mode() is None, "a test left an adaptive_eager mode active"


# Note [A test's compiles end with it]
# A compile still running when a test ends ran on into the next ones: a default-options
# pattern left an Inductor compile that took 2-13 s more (nanogpt_train, gan, loss_print,
# measured with a teardown probe), so the tests after it ran beside a busy worker (their
# ops measured dearer: loss_print "ops took 94 µs each ... worth capturing", not parked),
# and when it ended it took one from compiles_in_flight, which the next test had zeroed:
# -1 in flight, and the sampling test's report said "no compiled region ran: -1
# compiles still in flight" (CI at d373698). So each test waits for the compiles it
# queued, up to a bound (a test may leave a hung compile on purpose).
COMPILES_WAIT_S = 60.0


def _wait_for_compiles(counters) -> None:
    import time

    end = time.monotonic() + COMPILES_WAIT_S
    while counters.compiles_in_flight > 0 and time.monotonic() < end:
        time.sleep(0.02)


def pytest_configure(config):
    # The emulated neuron device (tests/test_devices.py) must be registered before the
    # first backward pass in the process: the autograd engine sizes its per-device
    # queues once, at its first use, from the devices known then.
    from adaptive_eager import neuron_sim

    neuron_sim.enable()
