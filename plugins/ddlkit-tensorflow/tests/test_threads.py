"""framework.num_threads sets both of TensorFlow's thread pools in every rank (issue 29, item 2):
N intra-op threads and one inter-op thread, so a rank computes on N cores, as a PyTorch rank
does. The threads are counted where they run: the model builder starts TensorFlow's runtime and
counts the rank's ``tf_Compute`` threads (the inter-op pool) in /proc, so what is checked is what
TensorFlow started, not what ddlkit asked for."""

from __future__ import annotations

import os
import re

import pytest

from ddlkit.testing import RunFactory

pytest.importorskip("keras")
pytest.importorskip("ddlkit_tensorflow")

pytestmark = pytest.mark.slow

MODULE = """
import os

import keras
import tensorflow as tf


def cnn(classes=4):
    tf.constant(1.0) + 1  # the runtime starts: its thread pools exist from here on
    names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
    threading = tf.config.threading
    print(f"rank threads: tf_Compute={names.count('tf_Compute')} intra={threading.get_intra_op_parallelism_threads()} "
          f"inter={threading.get_inter_op_parallelism_threads()}", flush=True)
    return keras.Sequential([keras.Input((8, 8, 3)), keras.layers.Conv2D(4, 3), keras.layers.GlobalAveragePooling2D(),
                             keras.layers.Dense(classes)])
"""
RUN = [
    "model=custom",
    "model.target=nets:cnn",
    "data.image_size=8",
    "data.num_classes=4",
    "data.length=64",
    "trainer.batch_size=16",
    "trainer.max_steps=1",
    "trainer.validate=false",
    "trainer.save_model=false",
]
NO_THREAD_SETTINGS = {"OMP_NUM_THREADS": "", "TF_NUM_INTEROP_THREADS": "", "TF_NUM_INTRAOP_THREADS": ""}


@pytest.fixture
def run_factory(run_factory: RunFactory) -> RunFactory:
    (run_factory.base_dir / "nets.py").write_text(MODULE)
    return run_factory


def counts(text: str) -> list[tuple[int, int, int]]:
    return [tuple(map(int, m)) for m in re.findall(r"rank threads: tf_Compute=(\d+) intra=(\d+) inter=(\d+)", text)]


@pytest.mark.parametrize("framework", ["tensorflow", "keras"])
def test_one_thread_from_the_command_line_is_one_thread_in_each_pool(run_factory: RunFactory, framework: str) -> None:
    out = run_factory(f"framework={framework}", *RUN, "framework.num_threads=1", env=NO_THREAD_SETTINGS)
    out.assert_success()
    # before: intra=1 inter=0 and one tf_Compute thread per core
    assert counts(out.stdout) == [(1, 1, 1)], out.output
    assert "| 1 rank(s) x 1 thread(s) x batch 16" in out.stdout


def test_an_inter_op_count_in_the_environment_is_kept(run_factory: RunFactory) -> None:
    out = run_factory(
        "framework=tensorflow",
        *RUN,
        "framework.num_threads=1",
        env={**NO_THREAD_SETTINGS, "TF_NUM_INTEROP_THREADS": "3"},
    )
    out.assert_success()
    assert counts(out.stdout) == [(3, 1, 0)], out.output


def test_under_mpirun_each_rank_of_auto_gets_its_share_and_one_inter_op_thread(run_factory: RunFactory) -> None:
    # auto on local_mpi: OMP_NUM_THREADS, which the target sets to the cores per rank
    out = run_factory(
        "framework=tensorflow",
        *RUN,
        "compute=local_mpi",
        "compute.procs_per_node=2",
        "dist=native",
        env=NO_THREAD_SETTINGS,
        timeout=300,
    )
    out.assert_success()
    logs = "".join((out.job_dir / f"rank-{r}.log").read_text() for r in (0, 1))
    intra = max(1, len(os.sched_getaffinity(0)) // 2)
    # MultiWorkerMirroredStrategy's server has an inter-op pool of its own beside the eager
    # context's: one thread each (before: one per core each)
    assert counts(logs) == [(2, intra, 1)] * 2, out.output + logs
