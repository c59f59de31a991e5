"""What the SDK learns from the environment: ranks per launcher, job names, GPUs, settings."""

from __future__ import annotations

import re

import pytest

from gpumon.client import env
from gpumon.client.protocol import DTYPES, MAX_DEVICES, NAME_PATTERN

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "16", "LOCAL_RANK": "1"}
SLURM = {"SLURM_PROCID": "9", "SLURM_NTASKS": "32", "SLURM_LOCALID": "3"}
OMPI = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
PMI = {"PMI_RANK": "7", "PMI_SIZE": "8", "MPI_LOCALRANKID": "3"}


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, (None, 0, 1, None)),
        (TORCHRUN, ("torchrun", 5, 16, 1)),
        (SLURM, ("slurm", 9, 32, 3)),
        (OMPI, ("openmpi", 2, 4, 0)),
        (PMI, ("mpich", 7, 8, 3)),
        ({"PMI_RANK": "1", "PMI_SIZE": "2"}, ("mpich", 1, 2, None)),
        # torchrun inside a Slurm allocation: torchrun's own variables win, all three of them
        ({**SLURM, **TORCHRUN}, ("torchrun", 5, 16, 1)),
        ({**SLURM, "RANK": "3", "WORLD_SIZE": "8"}, ("torchrun", 3, 8, None)),
        ({**OMPI, **SLURM}, ("slurm", 9, 32, 3)),
        ({**PMI, **OMPI}, ("openmpi", 2, 4, 0)),
        # garbage is skipped, not trusted
        ({"RANK": "x", **SLURM}, ("slurm", 9, 32, 3)),
        ({"RANK": "-1"}, (None, 0, 1, None)),
        ({"RANK": " 3 ", "WORLD_SIZE": "0"}, ("torchrun", 3, 1, None)),
    ],
)
def test_placement_per_launcher(environ: dict[str, str], expected: tuple[object, ...]) -> None:
    p = env.detect_placement(environ)
    assert (p.launcher, p.rank, p.world_size, p.local_rank) == expected


@pytest.mark.parametrize(
    ("explicit", "environ", "argv", "expected"),
    [
        ("my-run", {"GPUMON_JOB": "other"}, ["train.py"], "my-run"),
        (None, {"GPUMON_JOB": "from-env", "TORCHELASTIC_RUN_ID": "abc"}, ["train.py"], "from-env"),
        (None, {"TORCHELASTIC_RUN_ID": "abc123", "SLURM_JOB_ID": "77"}, ["train.py"], "abc123"),
        (None, {"TORCHELASTIC_RUN_ID": "none", "SLURM_JOB_ID": "77"}, ["train.py"], "slurm-77"),
        (None, {"SLURM_JOB_ID": "77", "SLURM_JOB_NAME": "llama pretrain"}, ["train.py"], "llama-pretrain-77"),
        (None, {}, ["/home/me/scripts/train_gpt.py", "--lr", "1"], "train_gpt"),
        (None, {}, ["/usr/bin/torchrun"], "torchrun"),
        (None, {}, [""], "python"),
        (None, {}, ["-c"], "python"),
        (None, {}, [], "python"),
        ("  spaces and é ", {}, [], "spaces-and--"),
        ("_leading", {}, [], "leading"),
        ("---", {}, [], "python"),
        ("a" * 200, {}, [], "a" * 128),
        ("ok/name@v1+x=y:z.w", {}, [], "ok/name@v1+x=y:z.w"),
    ],
)
def test_job_name(explicit: str | None, environ: dict[str, str], argv: list[str], expected: str) -> None:
    name = env.detect_job(explicit, environ, argv)
    assert name == expected
    assert re.match(NAME_PATTERN, name)


@pytest.mark.parametrize(
    ("cvd", "expected"),
    [
        (None, None),
        ("2,3", ["2", "3"]),
        (" 0 , 1 ", ["0", "1"]),
        ("", []),
        ("-1", []),
        ("NoDevFiles", []),
        ("0,2,-1,3", ["0", "2"]),  # CUDA stops at the first invalid entry
        (
            "GPU-8932f937-d72c-4106-c12f-20bd9faed9f6,GPU-1234",
            ["GPU-8932f937-d72c-4106-c12f-20bd9faed9f6", "GPU-1234"],
        ),
        ("MIG-4f8e2f4c-1c5a-5e8e-9d5c-1a2b3c4d5e6f", ["MIG-4f8e2f4c-1c5a-5e8e-9d5c-1a2b3c4d5e6f"]),
        ("MIG-GPU-8932f937/1/0", ["MIG-GPU-8932f937/1/0"]),
    ],
)
def test_visible_devices(cvd: str | None, expected: list[str] | None) -> None:
    environ = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    assert env.visible_devices(environ) == expected


class FakeTorchDevice:
    def __init__(self, type: str, index: int | None) -> None:
        self.type = type
        self.index = index


@pytest.mark.parametrize(
    ("device", "local_rank", "cvd", "expected"),
    [
        # defaults: the local rank's GPU through CUDA_VISIBLE_DEVICES
        (None, 1, None, ["1"]),
        (None, 1, "2,3", ["3"]),
        (None, 0, "GPU-aaa,GPU-bbb", ["GPU-aaa"]),
        (None, 3, "5", ["5"]),  # Slurm per-task binding: one visible GPU, whatever the local rank
        (None, 3, "0,1", []),  # out of range: unknown rather than a guess
        (None, None, None, []),
        (None, None, "4", ["4"]),
        (None, None, "4,5", []),
        (None, 0, "", []),
        # explicit
        (1, None, "2,3", ["3"]),
        ("cuda:0", None, "6,7", ["6"]),
        ("GPU-abc", None, "0", ["GPU-abc"]),
        ("5", None, "0,1", ["5"]),  # a decimal string is an NVML index, not mapped
        ([0, 1, "cuda:1"], None, "4,5", ["4", "5"]),
        ((0, "GPU-x"), None, None, ["0", "GPU-x"]),
        (FakeTorchDevice("cuda", 1), None, "2,3", ["3"]),
        ([], 0, None, []),
    ],
)
def test_resolve_devices(
    device: object, local_rank: int | None, cvd: str | None, expected: list[str]
) -> None:
    environ = {} if cvd is None else {"CUDA_VISIBLE_DEVICES": cvd}
    devices, problems = env.resolve_devices(device, local_rank, environ)
    assert devices == expected
    assert problems == []


@pytest.mark.parametrize("bad", [-1, "cpu", "cuda", True, 1.5, FakeTorchDevice("cpu", None), None.__class__])
def test_resolve_devices_reports_what_it_cannot_use(bad: object) -> None:
    devices, problems = env.resolve_devices([bad, 0], None, {})
    assert devices == ["0"]
    assert len(problems) == 1


def test_resolve_devices_caps_the_count() -> None:
    devices, problems = env.resolve_devices(list(range(MAX_DEVICES + 2)), None, {})
    assert len(devices) == MAX_DEVICES and problems


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("bf16", "bf16"),
        ("bfloat16", "bf16"),
        ("BF16", "bf16"),
        ("torch.bfloat16", "bf16"),
        ("float16", "fp16"),
        ("half", "fp16"),
        ("fp16", "fp16"),
        ("float32", "fp32"),
        ("float", "fp32"),
        ("tf32", "tf32"),
        ("fp8", "fp8"),
        ("fp8_e4m3", "fp8"),
        ("fp8_e5m2", "fp8"),
        ("torch.float8_e4m3fn", "fp8"),
        ("int8", None),
        ("", None),
    ],
)
def test_dtype_aliases(alias: str, expected: str | None) -> None:
    assert env.normalize_dtype(alias) == expected
    assert expected is None or expected in DTYPES


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("0", False),
        ("false", False),
        ("OFF", False),
        ("no", False),
        ("1", True),
        ("true", True),
        ("x", None),
    ],
)
def test_env_flag(raw: str | None, expected: bool | None) -> None:
    assert env.env_flag(raw) is expected


class StandInModel:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[bool, str]] = []
        self.fail = fail

    def flops_per_token(self, train: bool = True, convention: str = "palm") -> float:
        self.calls.append((train, convention))
        if self.fail:
            raise RuntimeError("boom")
        return 6e9 if train else 2e9


def test_settings_defaults_and_env() -> None:
    s, problems = env.resolve(
        {
            **TORCHRUN,
            "GPUMON_URL": "unix:///run/gpumon.sock",
            "GPUMON_REPORT_INTERVAL": "0.5",
            "GPUMON_JOB": "j",
        }
    )
    assert problems == []
    assert (s.job, s.rank, s.world_size, s.local_rank, s.devices) == ("j", 5, 16, 1, ["1"])
    assert (s.url, s.interval, s.token, s.kind) == ("unix:///run/gpumon.sock", 0.5, None, "train")


def test_settings_explicit_beats_env() -> None:
    s, problems = env.resolve(
        TORCHRUN, rank=2, world_size=4, local_rank=0, url="http://127.0.0.1:1", interval=2
    )
    assert problems == []
    assert (s.rank, s.world_size, s.local_rank, s.url, s.interval) == (2, 4, 0, "http://127.0.0.1:1", 2.0)


def test_settings_flops_from_model_and_conventions() -> None:
    model = StandInModel()
    s, _ = env.resolve({}, model=model)
    assert (s.flops_per_token, s.flops_convention) == (6e9, "palm")
    s, _ = env.resolve({}, model=model, kind="inference", flops_convention="megatron")
    assert (s.flops_per_token, s.flops_convention) == (2e9, "megatron")
    assert model.calls == [(True, "palm"), (False, "megatron")]
    s, _ = env.resolve({}, model=model, flops_per_token=1e9)
    assert (s.flops_per_token, s.flops_convention) == (1e9, "user")
    s, _ = env.resolve({}, flops_per_token=1e9, flops_convention="megatron")
    assert s.flops_convention == "megatron"
    s, _ = env.resolve({}, flops_convention="palm")
    assert (s.flops_per_token, s.flops_convention) == (None, None)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"rank": -1},
        {"rank": True},
        {"world_size": 0},
        {"rank": 4, "world_size": 4},
        {"kind": "serve"},
        {"workload": "has space"},
        {"dtype": "int4"},
        {"flops_per_token": -3},
        {"flops_per_token": float("nan")},
        {"model": StandInModel(fail=True)},
        {"flops_convention": "chinchilla"},
        {"peak_flops": 0},
        {"interval": "soon"},
        {"interval": -1},
        {"device": "tpu:0"},
        {"job": "bad job"},
    ],
)
def test_settings_problems_are_reported_and_defaulted(kwargs: dict[str, object]) -> None:
    s, problems = env.resolve({}, **kwargs)  # type: ignore[arg-type]
    assert len(problems) == 1, problems
    assert s.kind in ("train", "inference") and 0 <= s.rank < s.world_size
    assert s.interval > 0 and re.match(NAME_PATTERN, s.job)


def test_interval_has_a_floor() -> None:
    s, _ = env.resolve({}, interval=0.0001)
    assert s.interval == 0.01
