"""Ray's auto-init is off only while one of rlmon's calls into Ray is in flight, from any
thread, and Ray's own setting comes back after the last of them (the end-to-end race:
tests/ray/test_unreachable_ray.py)."""

from __future__ import annotations

import threading

from ray._private import auto_init_hook

from rlmon.actors.runtime.no_auto_init import no_auto_init


def test_auto_init_is_off_inside_and_back_after_nested_calls() -> None:
    before = auto_init_hook.enable_auto_connect
    with no_auto_init():
        assert auto_init_hook.enable_auto_connect is False
        with no_auto_init():
            assert auto_init_hook.enable_auto_connect is False
        assert auto_init_hook.enable_auto_connect is False  # the outer call is still in flight
    assert auto_init_hook.enable_auto_connect is before


def test_overlapping_calls_on_two_threads_restore_it_when_the_last_ends() -> None:
    before = auto_init_hook.enable_auto_connect
    inside, release = threading.Event(), threading.Event()

    def call() -> None:
        with no_auto_init():
            inside.set()
            release.wait(10)

    other = threading.Thread(target=call)
    other.start()
    assert inside.wait(10)
    with no_auto_init():
        pass
    assert auto_init_hook.enable_auto_connect is False  # the other thread's call is in flight
    release.set()
    other.join(10)
    assert auto_init_hook.enable_auto_connect is before


def test_a_setting_the_user_chose_is_kept() -> None:
    before = auto_init_hook.enable_auto_connect
    auto_init_hook.enable_auto_connect = False  # RAY_ENABLE_AUTO_CONNECT=0
    try:
        with no_auto_init():
            pass
        assert auto_init_hook.enable_auto_connect is False
    finally:
        auto_init_hook.enable_auto_connect = before
