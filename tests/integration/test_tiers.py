"""The sandbox suite against every tier: the existing tests that make sense for a VM (exec,
streaming, files, tar trees, background processes, TTL, limits) run unchanged against a
container and against a microVM, from one parametrised fixture.

Each case is a test function of another module of this suite, called with the same
fixtures it asks for, where `sandbox` is a fresh sandbox of the tier and `client` creates
sandboxes of the tier unless told otherwise. (The fork bomb and memory hog tests count
processes or use 64 MiB, which a guest kernel does not fit: test_microvm.py has the VM's own.) The microvm cases are marked `vm` (the
sanitizer runs leave them out: -m "not vm") and skip when the daemon has no microvm tier."""
import inspect

import pytest

import test_exec
import test_files
import test_images
import test_lifecycle
import test_limits
import test_process_world
import test_sdk_features
import test_streaming

CASES = [
    test_exec.test_exit_codes,
    test_exec.test_signals,
    test_exec.test_stdout_stderr_separate,
    test_exec.test_argv_is_not_resplit,
    test_exec.test_env_cwd_user_stdin,
    test_exec.test_missing_program,
    test_exec.test_output_cap_and_truncation,
    test_exec.test_large_output,
    test_exec.test_timeout_returns_timed_out,
    test_exec.test_timeout_kills_daemonised_grandchildren,
    test_exec.test_zombies_are_reaped,
    test_streaming.test_first_chunk_arrives_while_command_runs,
    test_streaming.test_order_preserved_per_stream,
    test_streaming.test_binary_safe,
    test_streaming.test_stream_exit_status_and_signal,
    test_streaming.test_stream_timeout,
    test_streaming.test_large_stream,
    test_files.test_write_read_binary_and_text,
    test_files.test_tmp_and_nested_paths,
    test_files.test_mode_and_executable,
    test_files.test_list_and_stat,
    test_files.test_remove,
    test_files.test_mkdir,
    test_files.test_large_file,
    test_files.test_read_directory_is_an_error,
    test_sdk_features.test_upload_1000_files_in_one_request,
    test_sdk_features.test_background_process_lifecycle,
    test_sdk_features.test_background_process_stdin_and_kill,
    test_process_world.test_background_process_is_found_and_stopped_by_later_execs,
    test_process_world.test_double_forked_daemon_dies_with_its_exec,
    test_images.test_docker_save_import_and_run,
    test_images.test_shared_base_stored_once_and_whiteouts,
    test_lifecycle.test_stopped_sandbox_refuses_work,
    test_lifecycle.test_create_env_reaches_commands,
    test_lifecycle.test_ttl_expiry,
    test_limits.test_limits_are_reported,
    test_limits.test_no_core_dumps_and_open_files_limit,
]


class TierClient:
    """The suite's client with `tier` as the default of create() and create_batch()."""

    def __init__(self, inner, tier: str) -> None:
        self._inner, self._tier = inner, tier

    def create(self, *args, **kwargs):
        kwargs.setdefault("tier", self._tier)
        return self._inner.create(*args, **kwargs)

    def create_batch(self, *args, **kwargs):
        kwargs.setdefault("tier", self._tier)
        return self._inner.create_batch(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._inner, name)


@pytest.fixture(params=["container", pytest.param("microvm", marks=pytest.mark.vm)])
def tier(request, client):
    if request.param not in client.version().get("tiers", []):
        pytest.skip(f"this daemon has no {request.param} tier")
    return request.param


@pytest.mark.parametrize("case", CASES, ids=lambda f: f"{f.__module__}.{f.__name__}")
def test_case_on_tier(case, tier, client, request):
    tc = TierClient(client, tier)
    args = {}
    for name in inspect.signature(case).parameters:
        if name == "sandbox":
            args[name] = tc.create(ttl=600)
        elif name == "client":
            args[name] = tc
        else:
            args[name] = request.getfixturevalue(name)
    try:
        case(**args)
    finally:
        if "sandbox" in args:
            args["sandbox"].kill()
