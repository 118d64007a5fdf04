"""The default torch thread count: one per idle core, so a busy machine does not stall a job."""

import multiprocessing as mp
import time

import torch

from envace.policy.threads import AdaptiveThreads, apply_threads, busy_cores, default_threads, usable_cores


def _spin():
    while True:
        pass


def test_busy_cores_sees_other_processes_and_a_long_job_moves_off_their_cores():
    before = torch.get_num_threads()
    cores = usable_cores()
    said = []
    adaptive = AdaptiveThreads(None, said.append, every_s=0.0)
    spinners = [mp.Process(target=_spin, daemon=True) for _ in range(cores)]
    for s in spinners:
        s.start()
    try:
        time.sleep(0.5)
        assert busy_cores() > cores - 0.5
        assert default_threads() == 1  # every core is taken: one thread, never zero
        assert adaptive.check() == 1 and torch.get_num_threads() == 1
        if cores > 1 and said[0].startswith(f"torch threads: {cores} "):  # it started on a quiet machine
            assert said[-1] == f"torch threads: {cores} -> 1 (idle cores changed)"
        fixed = AdaptiveThreads(cores, every_s=0.0)  # torch's count is per process: one job at a time
        assert fixed.check() == cores and torch.get_num_threads() == cores  # the user's choice stands
    finally:
        for s in spinners:
            s.terminate()
            s.join()
        torch.set_num_threads(before)


def test_an_explicit_thread_count_wins_and_several_ranks_keep_the_launchers(monkeypatch):
    before = torch.get_num_threads()
    try:
        logged = []
        assert apply_threads(1, logged.append) == 1 and torch.get_num_threads() == 1
        assert logged == []  # the user chose: nothing to explain
        torch.set_num_threads(2)
        monkeypatch.setenv("WORLD_SIZE", "2")
        assert apply_threads(None, logged.append) == 2 and logged == []
        monkeypatch.delenv("WORLD_SIZE")
        n = apply_threads(None, logged.append)
        assert 1 <= n <= usable_cores() and torch.get_num_threads() == n
        assert logged and logged[0].startswith(f"torch threads: {n} ")
    finally:
        torch.set_num_threads(before)
