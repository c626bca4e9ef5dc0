"""Shared fixtures: small datasets in the exact LeRobot layout, written once per test run."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from filelock import FileLock

from episodekit.core.video import have_av
from episodekit.sample import write_sample

# The slowest tests, as "file::function" (every parametrization of it): marked ``slow`` here, in
# one place, so that `make test` (``-m "not slow"``) stays within minutes on two cores while
# `make ci` (what .ci/run runs) runs them too. Chosen by CPU time (user + sys, subprocesses
# included) measured per test: the costliest (a Ray cluster, torch jobs, sweeps of signal moments,
# hint and output-folder runs), until `make test` needs about half of the whole suite's CPU time.
# A name that no longer exists is an error.
SLOW = frozenset(
    {
        "tests/app/test_cli_errors.py::test_every_reader_on_every_bad_root",
        "tests/app/test_cli_info.py::test_info_lists_the_video_files_of_each_camera",
        "tests/app/test_crash_sweep.py::test_repair_in_place_stopped_at_every_step",
        "tests/app/test_crash_sweep.py::test_repair_new_out_stopped_at_every_step",
        "tests/app/test_crash_sweep.py::test_repair_out_swap_stopped_at_every_step",
        "tests/app/test_crash_sweep.py::test_repair_restore_stopped_at_every_step",
        "tests/app/test_cli_info.py::test_one_of_everything_reads_in_the_singular",
        "tests/app/test_drop_flagged_frames.py::test_drop_flagged_drops_exactly_the_flagged_frames",
        "tests/app/test_hints_run.py::test_hint_runs_and_fixes_what_it_names",
        "tests/app/test_hostile_inputs.py::test_a_report_of_another_dataset_is_refused",
        "tests/app/test_hostile_inputs.py::test_image_stats_keep_lerobots_shape_through_edit_and_merge",
        "tests/app/test_hostile_inputs.py::test_merge_of_v30_and_v21_gives_valid_stats",
        "tests/app/test_hostile_writes.py::test_a_root_under_a_folder_with_glob_characters_is_read",
        "tests/app/test_hostile_writes.py::test_killed_between_swap_and_clean_up_leaves_a_complete_output",
        "tests/app/test_hostile_writes.py::test_newer_write_paths_killed_publish_nothing",
        "tests/app/test_lerobot_written.py::test_prep_and_metadata_commands",
        "tests/app/test_mixture_review.py::test_mixture_stats_status_line",
        "tests/app/test_mixture_review.py::test_plan_never_overwrites_the_users_mixture_file",
        "tests/app/test_mixture_review.py::test_plan_of_a_replaced_mixture_is_stale",
        "tests/app/test_output_folders.py::test_every_output_folder_follows_the_one_rule",
        "tests/app/test_output_folders.py::test_mixture_stats_never_replace_a_users_stats_json",
        "tests/app/test_output_folders.py::test_out_copy_refuses_a_foreign_folder_then_reruns_into_its_own",
        "tests/app/test_prepare.py::test_ray_executor_is_byte_identical_to_local",
        "tests/app/test_prepare.py::test_remote_root_prepared_into_out_and_pushed_in_one_commit",
        "tests/app/test_prepare_noop.py::test_any_change_of_a_file_or_an_option_takes_the_step_path",
        "tests/app/test_prepare_noop.py::test_out_copy_settles_videos_included",
        "tests/app/test_ray_cluster.py::test_a_node_killed_mid_run_changes_nothing",
        "tests/app/test_ray_cluster.py::test_cluster_has_three_nodes_with_their_own_resources",
        "tests/app/test_ray_cluster.py::test_prepare_on_the_cluster_is_byte_identical_to_local",
        "tests/app/test_repair_cli.py::test_in_place_signalled_at_any_moment",
        "tests/app/test_sample.py::test_v30_layout_and_schema",
        "tests/app/test_signals.py::test_sigint_at_any_moment_is_130",
        "tests/app/test_signals.py::test_sigterm_is_143_and_stops_the_pool",
        "tests/app/test_surgery_cli.py::test_drop_flagged_removes_exactly_the_seeded_episodes",
        "tests/app/test_trust_abort.py::test_no_abort_at_exit",
        "tests/app/test_trust_concurrency.py::test_kill_before_each_replace_then_rerun_cleans_up",
        "tests/app/test_trust_fuzz.py::test_fuzzed_root_never_tracebacks_or_escapes",
        "tests/loaders/test_elastic.py::test_loader_resume_on_other_world_sizes_real_frames",
        "tests/loaders/test_elastic_torch.py::test_dataloader_workers_take_steps_in_turn_and_resume_resized",
        "tests/loaders/test_elastic_torch.py::test_gloo_job_stops_on_2_and_resumes_on_1_and_3",
        "tests/loaders/test_sharded_torch.py::test_two_process_gloo_job_equal_counts_disjoint",
        "tests/loaders/test_store.py::test_framedataset_through_store_equals_parquet",
        "tests/loaders/test_workers.py::test_two_rank_gloo_job_one_ring_per_rank",
        "tests/loaders/test_workers.py::test_vid24_decoded_frames_pixel_equal",
        "tests/metadata/test_mixture_stats.py::test_cli_mixture_stats",
        "tests/metadata/test_speed_concurrency.py::test_eight_processes_leave_one_valid_file",
        "tests/metadata/test_speed_concurrency.py::test_torch_distributed_only_rank0_writes",
        "tests/prep/test_video_target.py::test_prepare_videos_gop_settles_and_leaves_lerobot_video_alone",
        "tests/repo/test_action.py::test_action_install_step_installs_episodekit_from_the_action",
        "tests/repo/test_packaging.py::test_sdist_and_wheel_install_and_run_in_a_fresh_venv",
        "tests/repo/test_precommit_hook.py::test_pre_commit_try_repo_passes_clean_and_fails_on_a_corrupted_info_json",
        "tests/validate/test_declared.py::test_samples_with_images_and_videos_have_none",
        "tests/validate/test_lerobot_corruptions.py::test_json_on_every_exit_path",
        "tests/writers/test_surgery_ray.py::test_edit_merge_convert_on_ray_equal_local",
    }
)


@pytest.hookimpl(tryfirst=True)  # before ``-m``/``-k`` deselect anything
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the tests :data:`SLOW` names; fail on a name its (collected) file does not define."""
    modules = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        modules[path] = getattr(item, "module", None)
        if f"{path}::{getattr(item, 'originalname', item.name)}" in SLOW:
            item.add_marker(pytest.mark.slow)
    stale = [
        name
        for name in sorted(SLOW)
        if name.split("::")[0] in modules
        and not hasattr(modules[name.split("::")[0]], name.split("::")[1])
    ]
    if stale:
        raise pytest.UsageError(f"tests/conftest.py SLOW names tests that do not exist: {stale}")


@pytest.fixture(scope="session")
def _sample_cache(tmp_path_factory) -> Path:
    """The folder of written samples, one per test run: under pytest-xdist every worker's base
    temp is a subfolder of the run's, so the workers share it (each sample is written once)."""
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent
    folder = base / "samples"
    folder.mkdir(exist_ok=True)
    return folder


def cached_sample(folder: Path, spec: dict) -> Path:
    """The sample ``spec`` describes, written into ``folder`` by the first process that asks
    (a file lock per spec; written under a temporary name, then renamed into place)."""
    key = hashlib.sha256(repr(sorted(spec.items())).encode()).hexdigest()[:16]
    path = folder / key
    with FileLock(str(folder / f"{key}.lock")):
        if not path.exists():
            tmp = folder / f"{key}.tmp{os.getpid()}"
            shutil.rmtree(tmp, ignore_errors=True)
            write_sample(tmp, **spec)
            os.replace(tmp, path)
    return path


@pytest.fixture
def make_sample(_sample_cache, tmp_path):
    """make_sample(**spec) -> Path of a fresh private copy of a sample dataset.

    Samples are written once per test run per spec and copied, so tests may modify their copy;
    ``copy=False`` gives the shared sample itself, which the test must only read.
    """

    def _make(copy: bool = True, **spec) -> Path:
        if spec.get("videos") and not have_av():
            pytest.skip("PyAV is not installed (pip install 'episodekit[video]')")
        shared = cached_sample(_sample_cache, spec)
        if not copy:
            return shared
        dst = tmp_path / f"copy{len(list(tmp_path.iterdir()))}"
        shutil.copytree(shared, dst)
        return dst

    return _make


@pytest.fixture
def small_root(make_sample) -> Path:
    """A 40-episode recorded-style v3.0 sample (private copy)."""
    return make_sample(episodes=40, tasks=6, seed=1)


@pytest.fixture
def on_tty():
    """on_tty(*args) -> what `episodekit *args` printed with a pseudo-terminal as its stdout and
    stderr (progress bars draw only on a terminal); asserts exit 0. EPISODEKIT_DEBUG unset."""
    import os
    import pty
    import sys

    cli = str(Path(sys.executable).parent / "episodekit")

    def run(*args: str) -> str:
        out = bytearray()

        def read(fd: int) -> bytes:
            data = os.read(fd, 65536)
            out.extend(data)
            return data

        saved = os.environ.pop("EPISODEKIT_DEBUG", None)
        try:
            status = pty.spawn([cli, *args], read)
        finally:
            if saved is not None:
                os.environ["EPISODEKIT_DEBUG"] = saved
        text = out.decode(errors="replace")
        assert os.waitstatus_to_exitcode(status) == 0, text
        return text

    return run
