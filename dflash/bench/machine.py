"""What the benchmark records about the machine, and resident-memory measurement.

Memory: all methods run in one process, so the process's lifetime RSS peak (`ru_maxrss`) only ever grows and
says nothing about the method that ran last. Instead `RssSampler` samples the RSS from a background thread
during each run and reports the peak of that run and the RSS just before it; before each run the allocator
is asked to return freed memory (`gc.collect` + glibc `malloc_trim`), so the increase is the run's own working
memory (KV caches, logits, draft state) on top of the loaded models, which every method shares.
"""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import sys
import threading
import time

import psutil
import torch

# Re-exported: one definition, in dflash.loading.host.
from dflash.loading.host import SIMD_FLAGS, cpu_flags, cpu_model  # noqa: F401

_MB = 1024 * 1024


def machine_info(device: str = "cpu") -> dict:
    import transformers

    info = {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "physical_cores": psutil.cpu_count(logical=False),
        "memory_gb": round(psutil.virtual_memory().total / 1024**3, 1),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "torch_threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu_flags": cpu_flags(),
        "mkldnn": torch.backends.mkldnn.is_available(),
        "onednn_head": os.environ.get("DFLASH_ONEDNN_HEAD", "1") != "0",
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        # Thread settings that change CPU timings a lot on a shared machine (BENCHMARKS.md).
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "MKL_NUM_THREADS", "DFLASH_ONEDNN_HEAD")
                if k in os.environ},
        "device": device,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def load_average() -> float | None:
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def trim_memory() -> None:
    """Collect garbage and hand freed heap pages back to the OS (glibc only; a no-op elsewhere)."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def rss_mb() -> float:
    return psutil.Process().memory_info().rss / _MB


class RssSampler:
    """`with RssSampler() as m: ...` → m.before_mb, m.peak_mb (sampled every `interval_s`, plus at both ends)."""

    def __init__(self, interval_s: float = 0.02):
        self.interval_s = interval_s
        self.before_mb = 0.0
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc = psutil.Process()

    def _sample(self) -> None:
        self.peak_mb = max(self.peak_mb, self._proc.memory_info().rss / _MB)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> "RssSampler":
        trim_memory()
        self.before_mb = self.peak_mb = rss_mb()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()


def now_iso() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")
