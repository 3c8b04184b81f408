"""Hardware metrics per rank, sampled off the training thread: host RSS and CPU everywhere,
device memory where torch has initialised CUDA, GPU utilisation and power where NVML answers."""

from __future__ import annotations

import sys
import threading

import psutil
import pytest

from rlmon.actors.reporter import Reporter
from rlmon.actors.reporter.hardware import HardwareSampler, visible_gpus
from rlmon.actors.reporter.sink import LocalSink
from rlmon.service.metrics import catalog
from rlmon.service.metrics.spec import Form

GPU_METRICS = (catalog.GPU_UTILIZATION, catalog.GPU_POWER_WATTS)


def test_sampler_reports_host_rss_and_cpu_in_catalog_forms() -> None:
    sampler = HardwareSampler(interval=3600)  # its thread waits: the test samples by hand
    try:
        busy = sum(i * i for i in range(300_000))  # some CPU time between two samples
        assert busy > 0
        sampler.sample()
        sampler.sample()
        stats = sampler.take()
        form, (rss,) = stats[catalog.HOST_RSS_BYTES]
        assert form is Form.MAX
        assert 0.5 < rss / psutil.Process().memory_info().rss < 2.0
        form, (cores, n) = stats[catalog.HOST_CPU_CORES]
        assert form is Form.MEAN and n == 2.0 and cores >= 0.0
        for name, (form, _) in stats.items():
            assert form in catalog.get(name).forms  # what the aggregator will accept
        again = sampler.take()  # a new step: one fresh sample when none was taken
        assert again[catalog.HOST_CPU_CORES][1][1] == 1.0
        if not sampler.gpu:  # no NVML device here: nothing pretends to be a GPU
            assert not set(GPU_METRICS) & set(stats)
        if "torch" not in sys.modules:  # rlmon never imports torch itself
            assert catalog.MEMORY_ALLOCATED_BYTES not in stats
    finally:
        sampler.close()


def test_samples_are_taken_on_their_own_thread_and_reach_the_step() -> None:
    sink = LocalSink()
    threads: set[str] = set()
    rep = Reporter("r", "actor", rank={}, world={}, sink=sink, hardware_interval=0.01)
    assert rep._hardware is not None
    original = rep._hardware.sample

    def sample() -> None:
        threads.add(threading.current_thread().name)
        original()

    rep._hardware.sample = sample  # type: ignore[method-assign]
    rep.record(catalog.LOSS, sum=1.0, count=1)
    rep.end_step(0)
    assert rep.flush(5)
    rep.close()
    (record,) = sink.records
    assert record.metrics[catalog.HOST_RSS_BYTES] > 0
    assert record.metrics[catalog.HOST_CPU_CORES] >= 0
    assert threading.main_thread().name not in threads  # never the training thread
    assert threads <= {"rlmon-hardware", "rlmon-reporter"}


@pytest.mark.skipif("CUDA_VISIBLE_DEVICES" not in __import__("os").environ
                    and not __import__("shutil").which("nvidia-smi"), reason="no GPU here")
def test_nvml_reports_the_gpu_where_one_is_present() -> None:
    sampler = HardwareSampler(interval=3600)
    try:
        assert sampler.gpu
        stats = sampler.take()
        util, n = stats[catalog.GPU_UTILIZATION][1]
        assert 0.0 <= util / n <= 1.0
        assert stats[catalog.GPU_POWER_WATTS][1][0] > 0
    finally:
        sampler.close()


@pytest.mark.parametrize(("env", "want"), [
    ({}, None),
    ({"CUDA_VISIBLE_DEVICES": "2"}, 1),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4),  # Ray: a tensor-parallel engine's actor
    ({"CUDA_VISIBLE_DEVICES": "GPU-aa,GPU-bb"}, 2),
    ({"CUDA_VISIBLE_DEVICES": "-1"}, None),
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_RANK": "3"}, 1),  # torchrun: one GPU each
])
def test_visible_gpus_and_the_reporters_gpus_per_rank(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], want: int | None) -> None:
    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert visible_gpus() == want
    rep = Reporter("r", "actor", rank={}, world={}, sink=LocalSink(), hardware_interval=None)
    try:
        assert rep.gpus_per_rank == float(want or 1)
        given = Reporter("r", "actor", rank={}, world={}, sink=LocalSink(),
                         hardware_interval=None, gpus_per_rank=8)
        assert given.gpus_per_rank == 8.0
        given.close()
    finally:
        rep.close()
