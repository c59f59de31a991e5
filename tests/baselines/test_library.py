"""The baseline library file, steady-state statistics, matching a job and the daemon's baseline gauges."""

from __future__ import annotations

import logging
import multiprocessing
import os
import time
from pathlib import Path

import pytest
from support.helpers import set_state
from support.reports import report

from gpumon.baselines import library as B
from gpumon.baselines.jobfigures import against, baseline_json, job_figures
from gpumon.baselines.steady import MIN_INTERVALS, NotSteady, steady
from gpumon.baselines.watch import LibraryWatch
from gpumon.jobs.analysis import Analysis
from gpumon.jobs.collector import IngestStats, TrainingCollector
from gpumon.jobs.report import parse
from gpumon.jobs.store import JobStore

H100 = "NVIDIA H100 80GB HBM3"
KEY = B.Key("llama3-8b", H100, 8, "bf16", "palm")


def base(name: str = "ref", key: B.Key = KEY, tps: float = 1000.0, **kw: object) -> B.Baseline:
    figures = B.Figures(tps, 2.0, 0.4, 2.5)
    return B.Baseline(name, key, figures, recorded_at="2026-11-22T14:00:00+00:00", **kw)  # type: ignore[arg-type]


# --- the file ---------------------------------------------------------------------------------------


def test_a_library_round_trips_through_its_file_with_every_field(tmp_path: Path) -> None:
    path = str(tmp_path / "sub" / "baselines.toml")
    b = base(
        note='quotes " and \\ and\nnewline, ünïcode', job_name="run-7", window_seconds=600.0, intervals=59
    )
    lib = B.Library((b, base("other", B.Key("bert", H100, 1, "fp16", ""), tps=5e4)))
    B.save(path, lib)
    again = B.load(path)
    assert again == lib
    text = Path(path).read_text()
    assert text.startswith("# gpumon baseline library") and "[[baseline]]" in text
    assert oct(os.stat(path).st_mode & 0o777) == "0o644"
    assert not [p for p in os.listdir(tmp_path / "sub") if p.endswith(".tmp")]


def test_a_symlinked_library_is_written_through_and_keeps_its_permissions(tmp_path: Path) -> None:
    target = tmp_path / "real" / "baselines.toml"
    target.parent.mkdir()
    B.save(str(target), B.Library((base(),)))
    os.chmod(target, 0o640)
    link = tmp_path / "baselines.toml"
    link.symlink_to(target)
    B.save(str(link), B.Library((base(), base("b", B.Key("x", H100, 1, "", ""), tps=5.0))))
    assert link.is_symlink() and len(B.load(str(target)).baselines) == 2
    assert oct(os.stat(target).st_mode & 0o777) == "0o640"


def test_a_missing_file_is_an_empty_library_and_bad_ones_say_where_and_what(tmp_path: Path) -> None:
    assert B.load(str(tmp_path / "none.toml")).baselines == ()
    entry = "[[baseline]]\nname='a'\nworkload='w'\ngpu_model='g'\ngpus=1\n"
    cases = {
        "version = 2\n": "version 2 is not supported",
        "[[baseline]\n": "not valid TOML",
        "[[baseline]]\nname = 'a'\n": "workload must be a non-empty string",
        entry.replace("gpus=1", "gpus=0"): "gpus must be a whole number >= 1",
        entry: "no figures",
        entry + "mfu=40\n": "mfu is a ratio from 0 to 1",
        entry + "mfu=0.4\ncolour=1\n": "unknown field(s) colour",
        entry.replace("'a'", "'a b'") + "mfu=0.4\n": "name must be",
        entry + "mfu='x'\n": "mfu must be a positive number",
        entry + "mfu=0.4\ndtype='BF16'\n": "dtype must be one of",
        entry + "mfu=0.4\nflops_convention='PaLM'\n": "flops_convention must be one of",
    }
    for text, message in cases.items():
        p = tmp_path / "bad.toml"
        p.write_text(text)
        with pytest.raises(B.LibraryError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
            B.load(str(p))
        assert str(p) in str(e.value)
    dup = "".join(
        f"[[baseline]]\nname='{n}'\nworkload='w'\ngpu_model='g'\ngpus=1\nmfu=0.4\n" for n in ("a", "b")
    )
    (tmp_path / "dup.toml").write_text(dup)
    with pytest.raises(B.LibraryError, match="'a' and 'b' have the same key"):
        B.load(str(tmp_path / "dup.toml"))


def test_put_refuses_to_overwrite_unless_asked_and_delete_names_what_is_missing() -> None:
    lib, old = B.Library().put(base("b"))
    assert old is None
    with pytest.raises(B.LibraryError, match="pass --replace"):
        lib.put(base("a"))  # another name, the same key
    lib2, old = lib.put(base("a", tps=1200.0), replace_existing=True)
    assert old is not None and old.name == "b" and [b.name for b in lib2.baselines] == ["a"]
    with pytest.raises(B.LibraryError, match="the name 'a' is taken by the baseline for llama3-8b on 8x"):
        lib2.put(base("a", B.Key("bert", H100, 1, "", "")), replace_existing=True)  # never drops another key
    with pytest.raises(B.LibraryError, match="no baseline named 'zz'"):
        lib2.without(["zz"])
    assert lib2.without(["a"]).baselines == ()


def test_matching_is_exact_and_the_scaling_reference_is_the_fewest_gpus() -> None:
    one = base("x1", B.Key("llama3-8b", H100, 1, "bf16", "palm"), tps=1100.0)
    eight = base("x8", KEY)
    other = base("fp8", B.Key("llama3-8b", H100, 2, "fp8", "palm"), tps=2000.0)
    lib = B.Library((one, eight, other))
    assert lib.match(KEY) is eight
    assert lib.match(B.Key("llama3-8b", H100, 16, "bf16", "palm")) is None
    assert lib.match(B.Key("llama3-8b", H100, 8, "bf16", "megatron")) is None
    assert lib.scaling_reference(B.Key("llama3-8b", H100, 64, "bf16", "palm")) is one
    alone = B.Library((eight,))
    assert alone.scaling_reference(KEY) is None, "a job against its own size measures no scaling"
    assert alone.scaling_reference(B.Key("llama3-8b", H100, 4, "bf16", "palm")) is None, "nor a larger one"
    assert alone.scaling_reference(B.Key("llama3-8b", H100, 16, "bf16", "palm")) is eight
    assert B.default_name(KEY) == "llama3-8b/H100-80GB-HBM3/x8/bf16/palm"


def _add(path: str, name: str, gpus: int) -> None:
    with B.editing(path) as box:
        time.sleep(0.2)  # hold the lock while the other process wants it
        box[0], _ = box[0].put(base(name, B.Key("w", H100, gpus, "bf16", "")))


@pytest.mark.slow
def test_concurrent_writers_do_not_lose_each_others_entries(tmp_path: Path) -> None:
    path = str(tmp_path / "b.toml")
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_add, args=(path, f"n{i}", i + 1)) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sorted(b.name for b in B.load(path).baselines) == ["n0", "n1", "n2"]


# --- steady-state statistics -----------------------------------------------------------------------


def samples(n: int, *, t0: float = 0.0, dt: float = 10.0, tps: float = 8000.0, step: float = 1.0, **kw):
    """What the daemon samples every ``dt`` seconds from 8 ranks stepping every ``step`` seconds: totals as
    of each rank's last step, and that step's time."""
    out = []
    for i in range(n):
        t = t0 + i * dt
        steps = int((t - t0) / step + 1e-9)
        out.append(
            {
                "time": t,
                "progress": t0 + steps * step,
                "tokens": steps * tps * step,
                "steps": float(steps),
                "ranks": 8,
                "gpus": 8,
                "restarts": 0,
                "progressing": True,
                "power_watts": 8 * 640.0,
                "flops_per_token": 6e9,
                "peak_flops": 8 * 989.5e12,
                **kw,
            }
        )
    return out


@pytest.mark.parametrize("step", [0.37, 1.0, 1.3, 2.7, 4.0, 6.0, 11.0, 15.0, 25.0])
def test_whole_steps_do_not_alias_against_the_sampling_period(step: float) -> None:
    """Steps longer than, or out of phase with, the 10 s sampling are measured exactly."""
    st = steady(samples(int(600 / 10), step=step), window=600.0, warmup=0.0)
    assert st.figures.tokens_per_second_per_gpu == pytest.approx(1000.0, rel=1e-6)
    assert st.figures.step_time_seconds == pytest.approx(step, rel=1e-6)


def test_steady_figures_are_the_recorded_rates() -> None:
    st = steady(samples(20), window=600.0, warmup=0.0)
    f = st.figures
    assert f.tokens_per_second_per_gpu == pytest.approx(1000.0)
    assert f.step_time_seconds == pytest.approx(1.0)
    assert f.mfu == pytest.approx(8000 * 6e9 / (8 * 989.5e12))
    assert f.tokens_per_joule == pytest.approx(8000 / (8 * 640.0))
    assert (st.intervals, st.outliers, st.dropped) == (19, 0, 0)


def test_warmup_checkpoints_and_restarts_do_not_move_the_baseline() -> None:
    s = samples(60)
    for x in s[:6]:  # warm-up: the first minute at a quarter of the speed
        x["tokens"] *= 0.25
    for x in s[40:]:  # one 30 s checkpoint: no progress, then the same pace
        x["tokens"] -= 8000 * 30.0
        x["steps"] -= 30.0
    for x in s[40:43]:
        x["steps"], x["tokens"], x["progress"] = s[39]["steps"], s[39]["tokens"], s[39]["progress"]
    st = steady(s, window=1e9, warmup=60.0)
    assert st.figures.tokens_per_second_per_gpu == pytest.approx(1000.0)
    assert st.figures.step_time_seconds == pytest.approx(1.0)
    assert st.outliers == 1  # the interval across the checkpoint
    # a restart: the warm-up counts again from it, and the interval across it is not used
    r = samples(60)
    for x in r[30:]:
        x["restarts"] = 1
    for x in r[30:36]:
        x["tokens"] *= 0.9
    assert steady(r, window=1e9, warmup=60.0).figures.tokens_per_second_per_gpu == pytest.approx(1000.0)
    with pytest.raises(NotSteady, match="since it started \\(or last restarted\\)"):
        steady(r[:34], window=1e9, warmup=60.0)


def test_a_slow_tail_is_an_outlier_for_step_time() -> None:
    s = samples(30, step=1.0)
    slow = samples(5, t0=300.0, tps=2000.0, step=4.0)
    base_tokens, base_steps = s[-1]["tokens"] + 80_000, s[-1]["steps"] + 10
    for x in slow:
        x["tokens"] += base_tokens
        x["steps"] += base_steps
    st = steady(s + slow[1:], window=1e9, warmup=0.0)
    assert st.outliers == 4
    assert st.figures.step_time_seconds == pytest.approx(1.0)


def test_too_little_steady_data_says_what_to_change() -> None:
    with pytest.raises(NotSteady, match="no history"):
        steady([], window=600.0, warmup=60.0)
    with pytest.raises(NotSteady, match=f"need {MIN_INTERVALS}.*shorten --warmup"):
        steady(samples(5), window=600.0, warmup=60.0)


# --- a job on this node against the library ---------------------------------------------------------


@pytest.fixture
def snap(sims, samplers):
    sim = sims("2xH100-SXM", static=True)
    for i in range(2):
        set_state(sim, i)
    return samplers(sim).sweep()


def job(snap, *reports):
    store = JobStore(max_jobs=8, max_ranks=16, ttl=600.0, window=60.0)
    for r in reports:
        store.ingest(parse(r), time.time())
    a = Analysis(store, lambda: snap)
    return a, a.jobs()


STARTED = time.time() - 10.0


def rank(r: int, steps: int = 100, **kw: object) -> dict:
    """A rank 100 steps into a 0.1 s/step run that ends now."""
    kw = {
        "rank": r,
        "world_size": 2,
        "devices": [str(r)],
        "workload": "llama3-8b",
        "incarnation": f"i{r}",
        **kw,
    }
    return report(steps, started=STARTED, **kw)


def ranks(*extra: dict) -> list[dict]:
    """Two reports per rank (halfway, then now), so the window has a step time."""
    return [
        rank(0, 50),
        rank(1, 50, **extra[1] if len(extra) > 1 else {}),
        rank(0),
        rank(1, **extra[1] if len(extra) > 1 else {}),
    ]


def test_a_jobs_key_and_figures_come_from_its_ranks_and_gpus(snap) -> None:
    _, (j,) = job(snap, *ranks())
    fig = job_figures(j)
    assert fig.key == B.Key("llama3-8b", H100, 2, "bf16", "palm")
    assert fig.gpus_on_node == 2
    assert fig.figures.tokens_per_second_per_gpu == pytest.approx(99_000 / 9.9)
    assert fig.figures.step_time_seconds == pytest.approx(0.1)
    assert fig.figures.mfu == pytest.approx(j.mfu)
    assert fig.figures.tokens_per_joule == pytest.approx(2 * 99_000 / 9.9 / (2 * 650.5))
    _, (j,) = job(snap, *ranks({}, {"dtype": "fp8"}))
    fig = job_figures(j)
    assert fig.key is None and "different dtypes" in (fig.why_no_key or "")


def families(collector: TrainingCollector) -> dict[str, list]:
    return {f.name: f.samples for f in collector.collect()}


def test_the_daemon_exposes_the_matching_baseline_and_the_ratios(snap, tmp_path: Path) -> None:
    a, (j,) = job(snap, *ranks())
    now = job_figures(j).figures
    assert now.tokens_per_second_per_gpu is not None
    path = str(tmp_path / "b.toml")
    key = B.Key("llama3-8b", H100, 2, "bf16", "palm")
    ref = base("two", key, tps=now.tokens_per_second_per_gpu / 0.8)
    single = base(
        "one", B.Key("llama3-8b", H100, 1, "bf16", "palm"), tps=now.tokens_per_second_per_gpu * 1.25
    )
    B.save(path, B.Library((ref, single)))
    c = TrainingCollector(a, IngestStats(), LibraryWatch(path))
    f = families(c)
    (info,) = f["gpumon_training_baseline_info"]
    assert info.labels == {
        "job_name": "llm",
        "baseline": "two",
        "workload": "llama3-8b",
        "gpu_model": H100,
        "gpus": "2",
        "dtype": "bf16",
        "flops_convention": "palm",
    }
    assert f["gpumon_training_throughput_baseline_ratio"][0].value == pytest.approx(0.8)
    assert f["gpumon_training_step_time_baseline_ratio"][0].value == pytest.approx(0.1 / 2.0)
    (scaling,) = f["gpumon_training_scaling_baseline_tokens_per_second_per_gpu"]
    assert scaling.labels["gpus"] == "1" and scaling.value == pytest.approx(
        ref.figures.tokens_per_second_per_gpu
    )
    assert f["gpumon_training_baseline_library_entries"][0].value == 2
    assert f["gpumon_training_baseline_library_ok"][0].value == 1
    doc = baseline_json(against(j, B.load(path)))
    assert doc["baseline"]["name"] == "two" and doc["ratios"]["tokens_per_second_per_gpu"] == pytest.approx(
        0.8
    )
    # another job shape: no baseline series at all, so rules comparing against one do not evaluate
    B.save(path, B.Library((single,)))
    os.utime(path, (time.time() + 5, time.time() + 5))
    c.library = LibraryWatch(path)
    f = families(c)
    assert "gpumon_training_baseline_info" not in f and "gpumon_training_throughput_baseline_ratio" not in f


def test_a_broken_library_keeps_the_last_good_one_and_says_so_once(tmp_path: Path, caplog) -> None:
    path = tmp_path / "b.toml"
    B.save(str(path), B.Library((base(),)))
    t = [0.0]
    w = LibraryWatch(str(path), clock=lambda: t[0])
    assert w.ok and len(w.library().baselines) == 1
    path.write_text("[[baseline]\n")
    with caplog.at_level(logging.ERROR, logger="gpumon.baselines.watch"):
        for _ in range(3):
            t[0] += 10
            assert len(w.library().baselines) == 1
    assert not w.ok and "not valid TOML" in (w.error or "")
    assert len([r for r in caplog.records if "not loaded" in r.message]) == 1
    B.save(str(path), B.Library((base(), base("b", B.Key("x", H100, 1, "", ""), tps=5.0))))
    t[0] += 10
    assert len(w.library().baselines) == 2 and w.ok
    path.unlink()
    t[0] += 10
    assert w.library().baselines == () and w.ok
