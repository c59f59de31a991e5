"""gpumon baseline record | list | show | compare | delete | import | export: the baseline library.

``record`` asks the daemon for a running job's recent history and stores its steady-state figures
(``gpumon.baselines.steady``); the daemon picks the file up within seconds and exposes the match as
gauges. Every command works on the library file (--baselines, GPUMON_BASELINES, or the default path), and
every change is one atomic write under a lock.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import getpass
import json
import os
import socket
import sys
import urllib.parse
from typing import Any

from gpumon import __version__
from gpumon.baselines import library as B
from gpumon.baselines.steady import NotSteady, method, steady
from gpumon.cli.baseline_render import comparison, table
from gpumon.cli.daemon_api import DaemonError, default_url, display_url, get_json, job_path
from gpumon.config import ConfigError, Settings, default_baselines_path, parse_duration
from gpumon.web.listen import is_loopback

USES_GPUS = False


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--baselines", metavar="PATH", help="the library file (default: as gpumon serve)")
    # accepted after the action too; SUPPRESS keeps an absent one from hiding the one given before it
    where = argparse.ArgumentParser(add_help=False)
    where.add_argument("--baselines", metavar="PATH", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    where.add_argument(
        "--url",
        metavar="URL",
        help="the daemon, http://, https://[USER:PASSWORD@] or unix:// (default $GPUMON_URL or "
        "http://127.0.0.1:9478): the one record and compare ask, and the local one whose library is used "
        "when --baselines is not given",
    )
    sub = p.add_subparsers(dest="action", metavar="ACTION", parser_class=type(p))
    sub.required = True

    def action(name: str, help_: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help_, description=help_, parents=[where])

    r = action("record", "store a running job's steady-state figures as its baseline")
    r.add_argument("--job", required=True, metavar="NAME", help="the job, as it reports (job_name)")
    r.add_argument("--window", default="10m", metavar="DURATION", help="look back this far (default 10m)")
    r.add_argument(
        "--warmup",
        default="60s",
        metavar="DURATION",
        help="ignore the job's first DURATION the daemon saw (default 60s)",
    )
    r.add_argument("--name", metavar="NAME", help="default: workload/GPU/xN/dtype")
    r.add_argument("--note", default="", metavar="TEXT", help="free text stored with the baseline")
    r.add_argument("--replace", action="store_true", help="overwrite the baseline recorded for the same key")
    r.add_argument("--dry-run", action="store_true", help="print what would be stored; write nothing")
    ls = action("list", "every baseline, one line each")
    ls.add_argument("--json", action="store_true")
    s = action("show", "one baseline with who recorded it, when and how")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    c = action("compare", "a running job now against its baseline, as the daemon sees it")
    c.add_argument("--job", required=True, metavar="NAME")
    c.add_argument("--json", action="store_true")
    d = action("delete", "remove baselines by name")
    d.add_argument("names", nargs="+", metavar="NAME")
    i = action("import", "add the baselines of another library file")
    i.add_argument("file", metavar="FILE")
    i.add_argument("--replace", action="store_true", help="overwrite entries recorded for the same keys")
    e = action("export", "write baselines (all, or those named) as a library file")
    e.add_argument("names", nargs="*", metavar="NAME")
    e.add_argument("-o", "--output", metavar="FILE", help="default: standard output")


WRITES = ("record", "delete", "import")


def run(settings: Settings, args: argparse.Namespace) -> int:
    path = _library_path(settings, args.url or default_url(), writing=args.action in WRITES)
    action = {
        "record": _record,
        "list": _list,
        "show": _show,
        "compare": _compare,
        "delete": _delete,
        "import": _import,
        "export": _export,
    }[args.action]
    try:
        return action(path, args)
    except B.LibraryError as exc:
        raise ConfigError(str(exc)) from None


def _library_path(settings: Settings, url: str, *, writing: bool) -> str:
    """The file to work on: --baselines (or GPUMON_BASELINES, or the config file) when given. Otherwise this
    user's default, and the local daemon is asked which file it reads: reading commands show that one (a
    user whose default differs from the daemon's, root's /var/lib/gpumon, sees the daemon's baselines), but
    a command that writes never writes where an answer over HTTP points (whoever listens on the port could
    name any file, and root would overwrite it): when the daemon reads another file it is refused, naming
    that file. A remote daemon's path is on another machine, so it is never used."""
    if settings.baselines != default_baselines_path() or not _local(url):
        return settings.baselines
    try:
        daemon = get_json(url, "/v1/baselines", timeout=2.0).get("path")
    except (DaemonError, ConfigError):
        return settings.baselines
    if not isinstance(daemon, str) or not daemon or daemon == settings.baselines:
        return settings.baselines
    if writing:
        raise ConfigError(
            f"the daemon at {display_url(url)} reads {daemon[:300]!r}, not this user's default "
            f"{settings.baselines}; nothing was written: pass --baselines with the file to write"
        )
    return daemon


def _local(url: str) -> bool:
    return url.startswith("unix://") or is_loopback(urllib.parse.urlsplit(url).hostname or "")


def _record(path: str, args: argparse.Namespace) -> int:
    window = parse_duration(args.window, "window")  # at most 1h: the history the daemon keeps
    # no warm-up to skip is a fair answer (the daemon started long after the job did)
    warmup = 0.0 if args.warmup.strip() in ("0", "0s", "0m", "0ms") else parse_duration(args.warmup, "warmup")
    url = args.url or default_url()
    get_json(  # the job exists (job_path: the empty-name check)
        url,
        job_path(args.job),
        missing=f"no job {args.job!r} reports to the daemon at {display_url(url)} (gpumon diagnose lists "
        "those that do)",
    )
    missing = (
        f"the daemon at {display_url(url)} has no history for job {args.job!r} yet: it samples every job "
        "every 10 s, and a baseline needs a few minutes of them (gpumon diagnose lists the jobs it sees)"
    )
    hist = get_json(url, "/v1/history/" + urllib.parse.quote(args.job, safe=""), missing=missing)
    if hist.get("key") is None:
        raise ConfigError(f"job {args.job!r} cannot be baselined: {hist.get('why_no_key') or 'no key'}")
    key = B.Key(**hist["key"])
    try:
        st = steady(hist.get("samples", []), window=window, warmup=warmup)
    except NotSteady as exc:
        raise ConfigError(f"job {args.job!r}: {exc}") from None
    name = args.name or B.default_name(key)
    base = B.Baseline(
        name=name,
        key=key,
        figures=B.Figures(**{k: _round(v) for k, v in dataclasses.asdict(st.figures).items()}),
        recorded_at=dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat(),
        recorded_by=f"{_user()}@{socket.gethostname()}",
        source=f"gpumon baseline record --job {args.job} --window {args.window} --warmup {args.warmup}",
        job_name=args.job,
        node=str(hist.get("node") or urllib.parse.urlsplit(url).netloc or url),
        window_seconds=round(st.seconds, 3),
        intervals=st.intervals,
        method=method(float(hist.get("interval_seconds", 10.0))),
        gpumon_version=__version__,
        note=args.note,
    )
    B.validate(base)  # as a load would check it, so --dry-run shows the same refusals as a real run
    spread = f", spread {100 * st.spread:.1f} %" if st.spread is not None else ""
    print(
        f"{name}: {key.describe()}\n  from {st.intervals} steady intervals over {st.seconds:.0f} s "
        f"({st.outliers} slow outliers and {st.dropped} unsteady intervals left out{spread})"
    )
    print(table([base]))
    if args.dry_run:
        print("(dry run: nothing written)")
        return 0
    with B.editing(path) as box:
        box[0], old = box[0].put(base, replace_existing=args.replace)
    print(f"stored in {path}" + (f", replacing the baseline recorded {old.recorded_at}" if old else ""))
    return 0


def _round(x: float | None) -> float | None:
    """Six significant digits: more than any measurement here supports, and readable in the file."""
    return None if x is None else float(f"{x:.6g}")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (a container's arbitrary uid)
        return str(os.getuid())


def _list(path: str, args: argparse.Namespace) -> int:
    lib = B.load(path)
    if args.json:
        print(json.dumps([b.to_dict() for b in lib.baselines], indent=2))
    elif not lib.baselines:
        print(f"No baselines in {path}. Record one: gpumon baseline record --job NAME")
    else:
        print(table(list(lib.baselines)))
    return 0


def _show(path: str, args: argparse.Namespace) -> int:
    b = _get(B.load(path), args.name)
    if args.json:
        print(json.dumps(b.to_dict(), indent=2))
    else:
        print("\n".join(f"{k:<26} {v}" for k, v in b.to_dict().items()))
    return 0


def _get(lib: B.Library, name: str) -> B.Baseline:
    b = lib.get(name)
    if b is None:
        known = ", ".join(x.name for x in lib.baselines) or "none"
        raise ConfigError(f"no baseline named {name!r} (known: {known})")
    return b


def _compare(path: str, args: argparse.Namespace) -> int:
    url = args.url or default_url()
    missing = (
        f"no job {args.job!r} reports to the daemon at {display_url(url)} "
        "(gpumon diagnose lists those that do)"
    )
    job = get_json(url, job_path(args.job), missing=missing)
    section: dict[str, Any] | None = job.get("baseline")
    if section is None:
        raise ConfigError(f"the daemon at {display_url(url)} is too old to compare against baselines")
    if args.json:
        print(json.dumps(section, indent=2))
    else:
        print(comparison(args.job, section))
    return 0


def _delete(path: str, args: argparse.Namespace) -> int:
    # unknown names refused before a lock file (or its folder) is made beside the library
    try:
        current = B.load(path)
    except B.LibraryError as exc:
        raise B.LibraryError(f"{exc}; nothing was written (fix the file, or move it aside)") from None
    current.without(args.names)
    with B.editing(path) as box:
        box[0] = box[0].without(args.names)
    print(f"deleted {', '.join(args.names)} from {path}")
    return 0


def _import(path: str, args: argparse.Namespace) -> int:
    if not os.path.exists(args.file):
        raise ConfigError(f"{args.file}: no such file")
    incoming = B.load(args.file)
    if not incoming.baselines:
        raise ConfigError(f"{args.file}: no baselines in it")
    with B.editing(path) as box:
        lib = box[0]
        for b in incoming.baselines:  # all or nothing: a refusal leaves the library as it was
            lib, _ = lib.put(b, replace_existing=args.replace)
        box[0] = lib
    print(f"imported {len(incoming.baselines)} baseline(s) from {args.file} into {path}")
    return 0


def _export(path: str, args: argparse.Namespace) -> int:
    lib = B.load(path)
    chosen = B.Library(tuple(_get(lib, n) for n in args.names)) if args.names else lib
    if args.output:
        B.save(args.output, chosen)
        print(f"wrote {len(chosen.baselines)} baseline(s) to {args.output}", file=sys.stderr)
    else:
        sys.stdout.write(B.render(chosen))
    return 0
