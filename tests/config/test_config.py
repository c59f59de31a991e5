"""Configuration: flags over GPUMON_* environment over config file over defaults, and clear errors."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from support.helpers import run_gpumon

from gpumon.config import ConfigError, Settings, parse_duration, resolve


def flags(**kw: object) -> dict[str, object]:
    return kw


def test_defaults() -> None:
    s = resolve({}, env={})
    assert s == Settings()
    assert s.listen == "0.0.0.0:9478" and s.interval == 1.0 and s.deadline == 0.5 and s.backend == "auto"


def test_precedence_flag_then_env_then_file_then_default(tmp_path: Path) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text('interval = "2s"\nlisten = "127.0.0.1:9000"\nseed = 3\nlog_level = "debug"\n')
    env = {"GPUMON_CONFIG": str(cfg), "GPUMON_LISTEN": "127.0.0.1:9100", "GPUMON_SEED": "5"}
    s = resolve(flags(seed="7"), env=env)
    assert s.seed == 7  # flag beats env and file
    assert s.listen == "127.0.0.1:9100"  # env beats file
    assert s.interval == 2.0 and s.log_level == "debug"  # file beats default
    assert s.timeout is None and s.deadline == 1.0


def test_config_flag_beats_env_config(tmp_path: Path) -> None:
    a, b = tmp_path / "a.toml", tmp_path / "b.toml"
    a.write_text("seed = 1\n")
    b.write_text("seed = 2\n")
    assert resolve(flags(config=str(b)), env={"GPUMON_CONFIG": str(a)}).seed == 2


def test_env_lists_and_simulation(tmp_path: Path) -> None:
    s = resolve({}, env={"GPUMON_SIMULATE": "2xL4", "GPUMON_SIM_FAULTS": "lost:1@5,slow:0:*=0.01"})
    assert s.simulated and s.simulate == "2xL4" and s.sim_faults == ["lost:1@5", "slow:0:*=0.01"]


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("1s", 1.0), ("500ms", 0.5), ("2m", 120.0), ("0.25", 0.25), (3, 3.0), (" 10 s ", 10.0)],
)
def test_durations(text, seconds) -> None:
    assert parse_duration(text, "interval") == seconds


@pytest.mark.parametrize("text", ["0", "-1s", "fast", "1h", "2d", True, ""])
def test_bad_durations(text) -> None:
    with pytest.raises(ConfigError, match="interval"):
        parse_duration(text, "interval")


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (dict(listen="nohost"), "bad listen address"),
        (dict(listen="1.2.3.4:99999"), "bad listen address"),
        (dict(backend="cuda"), "backend: expected one of auto, nvml, sim"),
        (dict(simulate="8xH999"), "unknown GPU model 'H999'"),
        (dict(simulate="2xL4", backend="nvml"), "conflicts"),
        (dict(simulate_if_no_gpu="2xL4", backend="nvml"), "only applies with --backend auto"),
        (dict(sim_faults=["lost:1"]), "needs simulated GPUs"),
        (dict(simulate="2xL4", sim_faults=["melt:1"]), "unknown fault kind"),
        (dict(seed="x"), "seed: expected an integer"),
        (dict(interval="1s", timeout="2s"), "must not exceed the interval"),
        (dict(log_level="loud"), "log-level"),
    ],
)
def test_bad_settings_name_the_setting(given, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(given, env={})


def test_config_file_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read config file .*missing\.toml"):
        resolve(flags(config=str(tmp_path / "missing.toml")), env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("interval = = 1\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        resolve(flags(config=str(bad)), env={})
    unknown = tmp_path / "unknown.toml"
    unknown.write_text('intervall = "1s"\n')
    with pytest.raises(ConfigError, match="unknown key 'intervall'"):
        resolve(flags(config=str(unknown)), env={})
    typed = tmp_path / "typed.toml"
    typed.write_text("interval = true\n")
    with pytest.raises(ConfigError, match="interval"):
        resolve(flags(config=str(typed)), env={})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"interval = [1]\n", "interval: expected a duration"),
        (b"sim_faults = 5\nsimulate = '1xL4'\n", "sim_faults: expected a list"),
        (b"seed = 1.5e400\n", "seed: expected an integer"),
        (b"seed = 1.5\n", "seed: expected an integer"),
        (b"listen = 9478\n", "listen: expected a string"),
        (b"backend = true\n", "backend: expected a string"),
        (b"log_level = {a = 1}\n", "log_level: expected a string"),
        (b"simulate = 8\n", "simulate: expected a string"),
        (b"interval = '\xff\xfe'\n", "not UTF-8 text"),
    ],
)
def test_config_file_values_of_the_wrong_type_are_clear_errors(tmp_path: Path, content, message) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_bytes(content)
    with pytest.raises(ConfigError, match=message):
        resolve(flags(config=str(cfg)), env={})


def test_deep_telemetry_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text(
        'events = false\nowner_labels = true\nprofiling = "gpm"\nkubelet_socket = ""\n'
        f'proc_root = "{tmp_path}"\ncompat = "dcgm"\n'
    )
    s = resolve({}, env={"GPUMON_CONFIG": str(cfg), "GPUMON_PROCESSES": "no"})
    assert (s.events, s.processes, s.owner_labels) == (False, False, True)
    assert (s.profiling, s.kubelet_socket, s.proc_root, s.compat) == ("gpm", "", str(tmp_path), "dcgm")
    s = resolve(
        flags(events=True, profiling="DCGM", dcgm_address="10.0.0.5:5555"), env={"GPUMON_CONFIG": str(cfg)}
    )
    assert s.events is True and s.profiling == "dcgm" and s.dcgm_address == "10.0.0.5:5555"
    assert resolve({}, env={}).kubelet_socket == "/var/lib/kubelet/pod-resources/kubelet.sock"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"GPUMON_EVENTS": "maybe"}, "events: expected true or false"),
        ({"GPUMON_OWNER_LABELS": "2"}, "owner-labels: expected true or false"),
        ({"GPUMON_PROFILING": "nsight"}, "profiling: expected one of auto, gpm, dcgm, off"),
        ({"GPUMON_PROFILING": "off", "GPUMON_DCGM_ADDRESS": "h:5555"}, "conflicts with --profiling off"),
        ({"GPUMON_PROC_ROOT": "/no/such/proc"}, "proc-root: /no/such/proc is not a directory"),
        ({"GPUMON_SYS_ROOT": "/no/such/sys"}, "sys-root: /no/such/sys is not a directory"),
        ({"GPUMON_NICS": "sometimes"}, "nics: expected true or false"),
        ({"GPUMON_COMPAT": "nvidia_gpu_exporter"}, "compat: expected one of dcgm"),
    ],
)
def test_bad_deep_telemetry_settings_say_what_to_fix(given: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve({}, env=given)


def test_training_settings_from_flags_env_and_file(tmp_path: Path) -> None:
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text(
        'max_jobs = 4\nrank_ttl = "2m"\npeak_tflops = {bf16 = 312, fp8 = 624}\n'
        "[thresholds]\ndata_wait_share = 0.2\n"
    )
    s = resolve({}, env={"GPUMON_CONFIG": str(cfg), "GPUMON_INGEST_TOKEN": "t" * 20})
    assert (s.max_jobs, s.max_ranks, s.rank_ttl, s.rate_window) == (4, 256, 120.0, 60.0)
    assert s.peak_tflops == {"bf16": 312e12, "fp8": 624e12}
    assert s.thresholds == {"data_wait_share": 0.2}
    assert s.ingest and s.ingest_token == "t" * 20 and not s.ingest_allow_remote
    s = resolve(
        flags(peak_tflops="989.5", thresholds=["sm_busy=0.7", "tensor_busy=0.5"], ingest=False),
        env={"GPUMON_RATE_WINDOW": "30s"},
    )
    assert s.peak_tflops["bf16"] == 989.5e12 and s.peak_tflops["fp32"] == 989.5e12
    assert s.thresholds == {"sm_busy": 0.7, "tensor_busy": 0.5} and s.rate_window == 30.0 and not s.ingest
    assert resolve({}, env={"GPUMON_THRESHOLDS": "link_busy=0.8,sm_idle=0.4"}).thresholds == {
        "link_busy": 0.8,
        "sm_idle": 0.4,
    }


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"GPUMON_MAX_JOBS": "0"}, "max-jobs: expected a whole number from 1"),
        ({"GPUMON_MAX_RANKS": "lots"}, "max-ranks: expected a whole number"),
        ({"GPUMON_RANK_TTL": "forever"}, "rank-ttl: expected a duration"),
        ({"GPUMON_INGEST_TOKEN": "short"}, "ingest-token: use at least 16"),
        ({"GPUMON_INGEST_SOCKET": "/no/such/dir/gpumon.sock"}, "ingest-socket: directory /no/such/dir"),
        ({"GPUMON_PEAK_TFLOPS": "bf17=3"}, "peak-tflops: .*unknown dtype 'bf17'"),
        ({"GPUMON_PEAK_TFLOPS": "fast"}, "peak-tflops: "),
        ({"GPUMON_THRESHOLDS": "data_wait=0.2"}, "unknown threshold 'data_wait'"),
        ({"GPUMON_THRESHOLDS": "data_wait_share=2"}, "between 0 and 1"),
        ({"GPUMON_INGEST": "sometimes"}, "ingest: expected true or false"),
    ],
)
def test_bad_training_settings_say_what_to_fix(given: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve({}, env=given)


def test_sim_jobs_from_flags_env_and_file(tmp_path: Path) -> None:
    s = resolve(
        {}, env={"GPUMON_SIMULATE": "8xH100-SXM", "GPUMON_SIM_JOBS": "llama-70b:0-3,6:4/12; bert-ft:4"}
    )
    assert s.sim_jobs == ["llama-70b:0-3,6:4/12", "bert-ft:4"]  # ";" between jobs: GPU lists have commas
    cfg = tmp_path / "gpumon.toml"
    cfg.write_text('backend = "sim"\nsim_jobs = ["a:0-7:8/24"]\n')
    assert resolve({}, env={"GPUMON_CONFIG": str(cfg)}).sim_jobs == ["a:0-7:8/24"]
    assert resolve(flags(simulate_if_no_gpu="2xL4", sim_jobs=["a:1"]), env={}).sim_jobs == ["a:1"]
    assert resolve(flags(simulate="2xL4", listen="[::1]:0", sim_jobs=["a:1"]), env={}).sim_jobs == ["a:1"]


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (dict(sim_jobs=["a:0"]), "--sim-job needs simulated GPUs"),
        (dict(simulate="2xL4", sim_jobs=["a:0"], ingest=False), "drop --no-ingest"),
        (dict(simulate="2xL4", sim_jobs=["a:0-2"]), "GPU 2 does not exist; the simulated node has 2"),
        (dict(backend="sim", sim_jobs=["a:0-8"]), "GPU 8 does not exist; the simulated node has 8"),
        (dict(simulate="2xL4", sim_jobs=["a:0-1", "b:1"]), "GPU 1 already runs sim job a"),
        (dict(simulate="2xL4", sim_jobs=["a:0:2/2"]), "do not fit in a world size of 2"),
        (dict(simulate="2xL4", sim_jobs=["a"]), "sim-job: bad sim job 'a'"),
        (dict(simulate="1xRTX-A6000", sim_jobs=["a:0"]), "no bf16 peak for RTX-A6000"),
        (dict(simulate="2xL4", sim_jobs=["a:0"], listen="10.1.2.3:9478"), "add --ingest-socket"),
        (dict(simulate="2xL4", sim_jobs=[5]), "sim_jobs: expected a list of job specs"),
    ],
)
def test_bad_sim_jobs_say_what_to_fix(given, message) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve(given, env={})


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("127.0.0.1", True),
        ("127.3.2.1", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("::10", False),
        ("0.0.0.0", False),
        ("10.1.2.3", False),
        ("gpu-node-1", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    from gpumon.web.listen import is_loopback

    assert is_loopback(host) is loopback


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda p: p.write_text("interval = " + "[" * 100_000), "nests arrays or tables deeper"),
        (lambda p: p.write_bytes(b"# " + b"x" * (1 << 20)), "is larger than 1 MiB"),
        (lambda p: p.mkdir(), "is a directory"),
        (lambda p: os.mkfifo(p), "is not a regular file"),  # opened without blocking: no writer needed
        (None, "is not a regular file"),  # /dev/zero: read without end before
    ],
    ids=["nested", "too large", "directory", "fifo", "dev-zero"],
)
def test_a_config_file_that_is_no_config_stops_startup_with_one_line(
    tmp_path: Path, make: Callable[[Path], object] | None, message: str
) -> None:
    path = Path("/dev/zero") if make is None else tmp_path / "gpumon.toml"
    if make is not None:
        make(path)
    r = run_gpumon("serve", "--simulate", "1xH100-SXM", "--listen", "127.0.0.1:0", "--config", str(path))
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0] and str(path) in lines[0], r.stderr


def test_compat_hostname_label_takes_either_spelling_of_dcgm_exporter_and_nothing_else() -> None:
    assert resolve({}, env={}).compat_hostname_label == "Hostname"
    env = {"GPUMON_COMPAT": "dcgm", "GPUMON_COMPAT_HOSTNAME_LABEL": " hostname"}
    assert resolve({}, env=env).compat_hostname_label == "hostname"
    with pytest.raises(ConfigError, match="expected Hostname or hostname"):
        resolve({"compat_hostname_label": "HOSTNAME", "compat": "dcgm"}, env={})
    with pytest.raises(ConfigError, match="add --compat dcgm"):  # a setting that would do nothing
        resolve({"compat_hostname_label": "hostname"}, env={})
    with pytest.raises(ConfigError, match="unknown 'bogus'"):
        resolve({"collect": ["all,bogus"]}, env={})


def test_collect_from_a_config_file_list(tmp_path: Path) -> None:
    path = tmp_path / "gpumon.toml"
    path.write_text('collect = ["nvlink-links", "device-state"]\n')
    assert resolve({"config": str(path)}, env={}).collect == ["nvlink-links", "device-state"]
    for bad in ("[3]", "0", "false"):
        path.write_text(f"collect = {bad}\n")
        with pytest.raises(ConfigError, match="collect: expected names"):
            resolve({"config": str(path)}, env={})


def test_the_nccl_inspector_directory(tmp_path: Path) -> None:
    assert resolve({}, env={}).nccl_inspector_dir is None
    later = tmp_path / "not-yet"  # the first job may create it: read once it exists
    assert resolve({}, env={"GPUMON_NCCL_INSPECTOR_DIR": str(later)}).nccl_inspector_dir == str(later)
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match=r"nccl-inspector-dir: .* is not a directory"):
        resolve({}, env={"GPUMON_NCCL_INSPECTOR_DIR": str(tmp_path / "file")})
    with pytest.raises(ConfigError, match="drop --no-ingest"):
        resolve(flags(ingest=False, nccl_inspector_dir=str(tmp_path)), env={})
    assert resolve({}, env={"GPUMON_NCCL_INSPECTOR_DIR": ""}).nccl_inspector_dir is None
    relative = resolve(flags(nccl_inspector_dir="dumps"), env={}).nccl_inspector_dir
    assert relative == os.path.abspath("dumps")  # where the daemon was started, said once
    cfg = tmp_path / "gpumon.toml"
    for bad in ("0", "false", "[]"):  # a TOML value that is no path is an error, not silence
        cfg.write_text(f"nccl_inspector_dir = {bad}\n")
        with pytest.raises(ConfigError, match="nccl_inspector_dir: expected a string"):
            resolve({}, env={"GPUMON_CONFIG": str(cfg)})
    with pytest.raises(ConfigError, match="printable"):
        resolve({}, env={"GPUMON_NCCL_INSPECTOR_DIR": "/tmp/a\nb"})
