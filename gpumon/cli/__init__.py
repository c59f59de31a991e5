"""The ``gpumon`` command: serve | snapshot | doctor | diagnose | estimate | baseline.

Every failure a user can cause (bad flag, bad config, no driver, busy port) ends in one line on stderr and a
non-zero exit, never a traceback: 2 for usage and configuration errors, 1 for runtime failures; doctor's 3
(cli/doctor.py), 70 for a bug, 130 interrupted, 141 stdout closed. docs/configuration.md#exit-status lists
them; keep the two in step.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import NoReturn

from gpumon import __version__
from gpumon.cli import baseline, diagnose, doctor, estimate, serve, snapshot
from gpumon.cli.common import add_common_options
from gpumon.cli.daemon_api import DaemonError
from gpumon.config import ConfigError, Settings, resolve, setup_logging
from gpumon.gpu.types import BackendUnavailable
from gpumon.web.listen import ListenError

COMMANDS = {
    "serve": (serve, "run the daemon: sample GPUs in the background and serve /metrics"),
    "snapshot": (snapshot, "sample once and print a per-GPU table (or --json)"),
    "doctor": (doctor, "report what this node supports, per GPU and quantity, with advice"),
    "diagnose": (diagnose, "explain why a training job is slow: the daemon's verdict, evidence and advice"),
    "estimate": (estimate, "per-GPU memory and FLOPs per token of training a transformer, from its shape"),
    "baseline": (baseline, "record, list, compare and manage the baselines jobs are compared against"),
}
# quieter by default for commands whose stdout is the product
_DEFAULT_LOG_LEVEL = {
    "serve": "info",
    "snapshot": "warning",
    "doctor": "warning",
    "estimate": "warning",
    "diagnose": "warning",
    "baseline": "warning",
}


_NEGATIVE = re.compile(r"^-\.?\d")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser: argparse.ArgumentParser = _Parser(
        prog="gpumon", description="GPU monitoring daemon and Prometheus exporter."
    )
    parser.add_argument("--version", action="version", version=f"gpumon {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands: dict[str, argparse.ArgumentParser] = {}
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        module.add_arguments(p)
        add_common_options(
            p,
            gpus=getattr(module, "USES_GPUS", True),
            exposition=getattr(module, "EXPOSES", False),
            log_level=_DEFAULT_LOG_LEVEL[name],
        )
        commands[name] = p
    return parser, commands


def _flags(args: argparse.Namespace) -> dict[str, object]:
    names = [f.name for f in dataclasses.fields(Settings)] + ["config"]
    return {n: getattr(args, n, None) for n in names}


def _negative_values(argv: Sequence[str]) -> list[str]:
    """``--interval -1s`` as ``--interval=-1s``: argparse takes a value that starts with a dash for an
    option and says "expected one argument"; joined, the value reaches its own check and its message."""
    out: list[str] = []
    for token in argv:
        if out and _NEGATIVE.match(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser, commands = build_parser()
    args, extra = parser.parse_known_args(_negative_values(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.error("choose a command: " + ", ".join(COMMANDS))
    if extra:  # reported by the subcommand, so the hint points at its own --help
        commands[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    prog = f"gpumon {args.command}"
    module = COMMANDS[args.command][0]
    try:
        settings = resolve(_flags(args))
        if args.log_level is None and settings.log_level == "info":
            settings.log_level = _DEFAULT_LOG_LEVEL[args.command]
        setup_logging(settings.log_level)
        status = module.run(settings, args)
        sys.stdout.flush()  # here, where a reader that went away is handled, not at interpreter exit
        return status
    except BrokenPipeError:
        # the reader went away (gpumon snapshot | head -1): end quietly, as a Unix tool killed by SIGPIPE
        # would; stdout is pointed at /dev/null so the interpreter's last flush does not complain either
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except (BackendUnavailable, ListenError, DaemonError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # the system failed the command, not gpumon (stdout on a full disk, a device gone): a runtime
        # failure; stdout goes to /dev/null so the interpreter's last flush does not fail on it again
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # never a traceback to the user; the details are one flag away
        logging.getLogger("gpumon").debug("internal error", exc_info=True)
        print(
            f"{prog}: internal error: {type(exc).__name__}: {exc} (rerun with --log-level debug for details, "
            "and please report it)",
            file=sys.stderr,
        )
        return 70
