import os
import sys

from hypothesis import HealthCheck, settings

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile(
    "default", deadline=None, max_examples=60, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", deadline=None, max_examples=60, derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile("ci" if os.environ.get("CI") else "default")


#: The modules that start real vLLM engines, longest first, run before every other test. The
#: README's test command runs the suite in two processes (pytest-xdist, ``--dist loadfile``),
#: which hands whole modules to its workers in this order: the engine modules start at once,
#: beside each other, and build their engines in the test's process before any test loads
#: llvmlite there (tests/vllm_engine/vllm_helpers.py says why that matters).
ENGINE_MODULES = ("vllm_engine/test_engine.py", "vllm_engine/test_heads_engine.py", "vllm_engine/test_bad_configs.py")


def pytest_configure(config):
    # pytest-xdist sorts modules by their number of tests before handing them out (its
    # --loadscope-reorder, on by default): the engine modules, a few tests each, would go last
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    def rank(item):
        path = item.path.as_posix()
        return next((i for i, name in enumerate(ENGINE_MODULES) if path.endswith("/tests/" + name)), len(ENGINE_MODULES))

    items.sort(key=rank)  # stable: the collection's order otherwise


def pytest_sessionfinish(session, exitstatus):
    """vLLM's log handlers write to the stream that was ``sys.stdout`` when vLLM was imported:
    pytest's capture, closed once the session ends. Engines that shut down after that (at exit)
    logged into the closed stream, and Python printed a ``--- Logging error ---`` traceback for
    each line. Before pytest closes its capture, every such handler is pointed at the process's
    own stderr, and vLLM's shutdown chatter below errors is dropped (its process manager warns
    as it stops the engines' processes at exit, which is how the module-scoped engines end)."""
    import logging

    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)] + [logging.root]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if type(handler) is logging.StreamHandler and handler.stream not in (sys.__stdout__, sys.__stderr__):
                if getattr(handler.stream, "closed", False):  # closed already (a run stopped by -x): no flush
                    handler.stream = sys.__stderr__
                else:
                    handler.setStream(sys.__stderr__)
    if "vllm" in sys.modules:
        logging.getLogger("vllm").setLevel(logging.ERROR)
