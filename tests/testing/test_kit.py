"""The test kit as plugin authors meet it: opt-in, isolating, and with fixtures that report
what they saw. Each scenario runs in its own pytest session (pytester)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ddlkit.plugins import DdlkitPluginManager
from ddlkit.testing import HookRecorder, RunFactory, alive, hold, wait_for, with_default_framework

pytest_plugins_line = 'pytest_plugins = ["ddlkit.testing"]\n'


def test_the_kit_is_opt_in(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(ddlkit_pm):\n    pass\n")
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'ddlkit_pm' not found*"])


def test_a_plugin_author_subclasses_a_contract(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(pytest_plugins_line)
    pytester.makepyfile("""
        import pytest
        from ddlkit.testing.contracts import StorageBackendContract
        from ddlkit.testing.fakes import MemoryStorage, MemoryStorageConfig

        class TestMine(StorageBackendContract):
            @pytest.fixture
            def backend(self):
                return MemoryStorage(MemoryStorageConfig())

        class Forgetful(MemoryStorage):
            def put(self, local_path, key):
                pass

        class TestForgetful(StorageBackendContract):
            @pytest.fixture
            def backend(self):
                return Forgetful(MemoryStorageConfig())
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q")
    # TestMine passes all 9; TestForgetful passes only the 2 that need no stored object
    result.assert_outcomes(passed=11, failed=7)
    failed = sorted(line.split("::")[-1].split(" ")[0] for line in result.outlines if line.startswith("FAILED"))
    assert all("TestForgetful" in line for line in result.outlines if line.startswith("FAILED"))
    assert failed == [
        "test_exists",
        "test_failed_put_keeps_previous_object",
        "test_get_replaces_local_file",
        "test_keys_escaping_the_root_are_rejected",
        "test_list_is_sorted_and_filtered_by_prefix",
        "test_put_get_round_trip",
        "test_put_replaces_previous_object",
    ]


def test_a_session_records_its_jobs_in_a_state_directory_of_its_own(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also jobs submitted by a module-scoped fixture or a test without ddlkit_isolation: never
    in the user's `ddlkit jobs list`."""
    monkeypatch.setenv("DDLKIT_STATE_DIR", "/the/users/own")
    pytester.makeconftest(pytest_plugins_line)
    pytester.makepyfile("""
        import pytest
        from ddlkit.launch import index

        @pytest.fixture(scope="module")
        def shared():
            return index.state_dir()

        def test_x(shared):
            assert shared == index.state_dir() and shared.is_dir()
            assert str(shared) != "/the/users/own"
    """)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert os.environ["DDLKIT_STATE_DIR"] == "/the/users/own"


def test_isolation_reports_a_leaked_environment_variable(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        pytest_plugins_line
        + """
import pytest

@pytest.fixture(autouse=True)
def _isolated(ddlkit_isolation):
    pass
"""
    )
    pytester.makepyfile("""
        import os

        def test_leaks():
            os.environ["DDLKIT_TEST_LEAK"] = "1"

        def test_uses_monkeypatch(monkeypatch):
            monkeypatch.setenv("DDLKIT_TEST_FINE", "1")

        def test_runs_in_its_tmp_path(tmp_path):
            assert os.getcwd() == str(tmp_path)

        def test_leak_was_undone():
            assert "DDLKIT_TEST_LEAK" not in os.environ
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=4, errors=1)
    assert (
        "ERROR at teardown of test_leaks" in result.stdout.str()
        and "the test changed environment variables ['DDLKIT_TEST_LEAK'] without monkeypatch; they were restored."
        in result.stdout.str()
    )


def test_isolation_hides_the_developer_shell(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DDLKIT_PLUGINS", "someone.elses.plugin")
    monkeypatch.setenv("DDLKIT_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makeconftest(pytest_plugins_line)
    pytester.makepyfile("""
        import os

        def test_clean(ddlkit_isolation):
            assert "DDLKIT_PLUGINS" not in os.environ
            assert "DDLKIT_DISABLE_PLUGIN_AUTOLOAD" not in os.environ
    """)
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_ddlkit_pm_has_builtins_only(ddlkit_pm: DdlkitPluginManager) -> None:
    assert sorted(n for n, _ in ddlkit_pm.list_name_plugin()) == [
        "ddlkit.builtin.console_logger",
        "ddlkit.builtin.custom_data",
        "ddlkit.builtin.imagefolder",
        "ddlkit.builtin.jsonl_logger",
        "ddlkit.builtin.local_compute",
        "ddlkit.builtin.local_ssd_storage",
        "ddlkit.builtin.local_storage",
        "ddlkit.builtin.nfs_storage",
        "ddlkit.builtin.run_loop",
        "ddlkit.builtin.synthetic_data",
    ]


def test_hook_recorder_records_calls_with_their_arguments(ddlkit_pm, hook_recorder: HookRecorder) -> None:
    ddlkit_pm.hook.ddlkit_configure(config={"a": 1})
    ddlkit_pm.hook.ddlkit_step_end(run=None, step=3, metrics={"loss": 1.0})
    assert hook_recorder.names() == ["ddlkit_configure", "ddlkit_step_end"]
    assert hook_recorder.getcall("ddlkit_step_end")["step"] == 3
    with pytest.raises(
        AssertionError,
        match=r"expected exactly one call of ddlkit_run_end, got 0; calls: "
        r"\['ddlkit_configure', 'ddlkit_step_end'\]",
    ):
        hook_recorder.getcall("ddlkit_run_end")
    hook_recorder.finish_recording()
    ddlkit_pm.hook.ddlkit_configure(config={})
    assert len(hook_recorder.calls) == 2


def test_with_default_framework() -> None:
    assert with_default_framework(["trainer.epochs=1"]) == ["framework=fake", "trainer.epochs=1"]
    assert with_default_framework(["framework=pytorch"]) == ["framework=pytorch"]
    assert with_default_framework(["+framework=x"]) == ["+framework=x"]


def test_a_failed_run_shows_its_output(run_factory: RunFactory) -> None:
    out = run_factory("framework=nope")
    with pytest.raises(AssertionError) as info:
        out.assert_success()
    message = str(info.value)
    assert message.startswith("ddlkit exited 2, expected 0\n$ ")
    assert "-m ddlkit framework=nope hydra.run.dir=" in message
    assert "--- stderr ---\nddlkit: error: unknown framework 'nope'" in message
    with pytest.raises(AssertionError, match=r"the run wrote no result\.json"):
        _ = out.result


def test_wait_for_returns_what_came_true_as_soon_as_it_does() -> None:
    answers = iter([None, [], "there"])
    t0 = time.monotonic()
    assert wait_for(lambda: next(answers), "the third answer", pace=0.01) == "there"
    assert time.monotonic() - t0 < 1


def test_wait_for_fails_after_its_timeout_saying_what_it_waited_for() -> None:
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=r"^timed out after 0.2 s waiting for the sky to fall\nstill up$"):
        wait_for(lambda: False, "the sky to fall", timeout=0.2, detail=lambda: "still up")
    assert 0.2 <= time.monotonic() - t0 < 5


def test_wait_for_fails_at_once_when_the_process_it_waits_on_has_exited() -> None:
    ended = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    t0 = time.monotonic()
    with pytest.raises(AssertionError, match=rf"^process {ended.pid} exited with status 3 before its answer$"):
        wait_for(lambda: None, "its answer", process=ended)
    assert time.monotonic() - t0 < 30  # not the 60 s timeout
    # what it did just before it exited counts: here it came true between a look and the exit
    looks = iter([None, "written"])
    assert wait_for(lambda: next(looks), "its answer", process=ended) == "written"


def test_alive_tells_a_running_process_from_an_ended_or_unreaped_one() -> None:
    assert alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    # a zombie until reaped: ended all the same
    wait_for(lambda: not alive(child.pid), "the child to end", timeout=30)
    child.wait()
    assert not alive(child.pid)


def test_hold_lets_the_time_pass_and_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    t0 = time.monotonic()
    hold(0.2, "nothing is to happen meanwhile")
    assert time.monotonic() - t0 >= 0.2
    assert capsys.readouterr().out == "holding 0.2 s: nothing is to happen meanwhile\n"
