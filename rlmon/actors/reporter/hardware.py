"""Hardware metrics of one rank, sampled on a thread of their own, never the training thread.

Every ``interval`` seconds the sampler reads, where present:

- device memory allocated and reserved, from torch's caching allocator (host-side counters, no
  device sync), only when the process already imported torch and initialised CUDA: rlmon never
  imports torch nor creates a CUDA context itself;
- GPU utilisation and power draw through NVML (``nvidia-ml-py``), for the rank's GPU: the first
  of ``CUDA_VISIBLE_DEVICES`` (as Ray sets it per actor; an index or a UUID), else the current
  torch device, else ``LOCAL_RANK``;
- the process's resident memory and CPU time (psutil), everywhere.

:meth:`HardwareSampler.take` hands the Reporter's sender thread the step's statistics in catalog
forms (peaks as ``max``, rates as ``(sum, count)`` over the samples) and starts the next step.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Any

from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import Form

__all__ = ["HardwareSampler", "visible_gpus"]

log = logging.getLogger(__name__)

Stats = dict[str, tuple[Form, tuple[float, ...]]]


def visible_gpus() -> int | None:
    """GPUs this process holds, as its launcher says (for goodput and cost): one under a
    per-GPU launcher (torchrun, DeepSpeed: ``LOCAL_RANK`` set), else the devices in
    ``CUDA_VISIBLE_DEVICES`` (Ray sets it per actor: a tensor-parallel engine's several);
    None when neither says (no GPU, or a process that sees them all)."""
    if os.environ.get("LOCAL_RANK", "").strip():
        return 1
    visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    if not visible or visible[0].strip() in ("-1", "NoDevFiles"):
        return None
    return len(visible)


def _nvml_handle() -> tuple[Any, Any] | None:
    """(pynvml, the rank's device handle), or None without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
        if visible.startswith(("GPU-", "MIG-")):
            return pynvml, pynvml.nvmlDeviceGetHandleByUUID(visible)
        if visible.isdigit():
            return pynvml, pynvml.nvmlDeviceGetHandleByIndex(int(visible))
        torch = _torch_cuda()
        index = torch.cuda.current_device() if torch is not None else int(
            os.environ.get("LOCAL_RANK", "0"))
        return pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception as exc:  # no driver, no GPU, a device we may not see
        log.debug("rlmon: no NVML device: %s", exc)
        return None


def _torch_cuda() -> Any:
    """torch, if this process imported it and initialised CUDA already (never imports it)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch
    except Exception:
        return None
    return None


class HardwareSampler:
    """Samples this process's hardware every ``interval`` seconds on a daemon thread."""

    def __init__(self, interval: float = 1.0) -> None:
        import psutil

        self.interval = interval
        self._process = psutil.Process()
        self._process.cpu_percent(None)  # the first call starts the CPU-time window
        self._nvml = _nvml_handle()
        self._lock = threading.Lock()
        self._peaks: dict[str, float] = {}
        self._sums: dict[str, list[float]] = {}  # name -> [sum, count]
        self._latest: dict[str, float] = {}  # each rate's latest sample
        self._last: Stats | None = None  # what the latest take would repeat
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rlmon-hardware", daemon=True)
        self._thread.start()

    def _read(self) -> tuple[dict[str, float], dict[str, float]]:
        """One sample: (peak-like values, rate-like values)."""
        peaks = {catalog.HOST_RSS_BYTES: float(self._process.memory_info().rss)}
        rates = {catalog.HOST_CPU_CORES: self._process.cpu_percent(None) / 100.0}
        torch = _torch_cuda()
        if torch is not None:
            peaks[catalog.MEMORY_ALLOCATED_BYTES] = float(torch.cuda.memory_allocated())
            peaks[catalog.MEMORY_RESERVED_BYTES] = float(torch.cuda.memory_reserved())
        if self._nvml is not None:
            nvml, handle = self._nvml
            try:
                rates[catalog.GPU_UTILIZATION] = nvml.nvmlDeviceGetUtilizationRates(
                    handle).gpu / 100.0
                rates[catalog.GPU_POWER_WATTS] = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0
            except Exception as exc:  # a device that stops answering: stop asking
                log.warning("rlmon: NVML sampling stopped: %s", exc)
                self._nvml = None
        return peaks, rates

    def sample(self) -> None:
        """Take one sample now (the sampler thread calls this every ``interval``)."""
        peaks, rates = self._read()
        with self._lock:
            for name, value in peaks.items():
                self._peaks[name] = max(value, self._peaks.get(name, value))
            for name, value in rates.items():
                acc = self._sums.setdefault(name, [0.0, 0.0])
                acc[0] += value
                acc[1] += 1.0
                self._latest[name] = value

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.sample()
            except Exception as exc:  # psutil on a vanishing process, a torch error
                log.debug("rlmon: hardware sample failed: %s", exc)

    def take(self) -> Stats:
        """The statistics since the last take, in catalog forms; the next step starts empty.

        A step shorter than the interval repeats the latest sample (read once, ever, when
        there is none yet): the sender thread never reads the hardware once per step.
        """
        with self._lock:
            empty = not self._peaks and not self._sums
        if empty and self._last is None:
            self.sample()
        with self._lock:
            if empty and self._last is not None:
                return dict(self._last)
            peaks, self._peaks = self._peaks, {}
            sums, self._sums = self._sums, {}
            stats: Stats = {name: (Form.MAX, (value,)) for name, value in peaks.items()}
            stats.update({name: (Form.MEAN, (s, n)) for name, (s, n) in sums.items()})
            last: Stats = {name: (Form.MAX, (value,)) for name, value in peaks.items()}
            last.update({name: (Form.MEAN, (self._latest[name], 1.0)) for name in sums})
            self._last = last
        return stats

    @property
    def gpu(self) -> bool:
        """Whether NVML answers for this rank's GPU."""
        return self._nvml is not None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
