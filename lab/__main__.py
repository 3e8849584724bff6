"""`python -m lab`: the lab commands consultants use by hand (DESIGN.md's table).

    python -m lab facts --inventory FILE
    python -m lab launch --inventory FILE --config FILE [--warm] [--timeout S]
    python -m lab stop --inventory FILE
    python -m lab parse-log --engine vllm|sglang FILE
    python -m lab sim serve --scenario FILE --state-dir DIR
    python -m lab sim catalog --scenario FILE

Every failure prints one line on stderr saying what went wrong and exits non-zero.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m lab", description="Reach a lab (real or simulated).")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    f = sub.add_parser("facts", help="JSON facts of every node, over SSH")
    f.add_argument("--inventory", required=True, type=Path)

    la = sub.add_parser("launch", help="launch a configuration cold and wait until it serves")
    la.add_argument("--inventory", required=True, type=Path)
    la.add_argument("--config", required=True, type=Path)
    la.add_argument("--warm", action="store_true", help="keep the page cache (not a cold start)")
    la.add_argument("--timeout", type=float, default=3600.0, help="lab seconds to wait (3600)")

    st = sub.add_parser("stop", help="stop the engine on every node")
    st.add_argument("--inventory", required=True, type=Path)

    pl = sub.add_parser("parse-log", help="one JSON object per recognized engine log line")
    pl.add_argument("--engine", required=True, choices=["vllm", "sglang"])
    pl.add_argument("file", type=Path)

    sim = sub.add_parser("sim", help="the simulated lab")
    simsub = sim.add_subparsers(dest="sim_command", required=True, parser_class=_Parser)
    serve = simsub.add_parser("serve", help="run the simulated lab on loopback until stopped")
    serve.add_argument("--scenario", required=True, type=Path)
    serve.add_argument("--state-dir", required=True, type=Path)
    cat = simsub.add_parser("catalog", help="the catalog (JSON) the simulated lab writes for its scenario")
    cat.add_argument("--scenario", required=True, type=Path)
    return p


def _print(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True) + "\n")


def _cmd_facts(args: argparse.Namespace) -> int:
    from lab.session import LabSession

    with LabSession.open(args.inventory) as session:
        facts = session.facts(tolerate=True)
    out = {k: (v if isinstance(v, dict) else {"error": str(v)}) for k, v in facts.items()}
    sys.stdout.write(json.dumps(out, indent=2, sort_keys=True) + "\n")
    failed = [k for k, v in out.items() if "error" in v]
    if failed:
        sys.stderr.write(f"lab facts: no answer from {', '.join(failed)} (see their 'error')\n")
        return 1
    return 0


def _cmd_launch(args: argparse.Namespace) -> int:
    from lab.engines import load_config_text
    from lab.session import LabSession

    try:
        text = args.config.read_text()
    except OSError as exc:
        raise _Fail(f"cannot read --config {args.config}: {exc.strerror}") from exc
    with LabSession.open(args.inventory) as session:
        # Admitted against this lab's own catalog (the one its inventory names), as a job's
        # intake does for the lab it books: another lab's models are not this one's.
        config = load_config_text(text, catalog=session.inventory.catalog)
        result = session.launch(config, cold=not args.warm, timeout_s=args.timeout)
    _print({"endpoint": result.endpoint, "cold_start_s": result.cold_start_s, "warm": result.warm})
    return 0


def _cmd_stop(args: argparse.Namespace) -> int:
    from lab.session import LabSession

    with LabSession.open(args.inventory) as session:
        result = session.stop()
    out = {k: (v if isinstance(v, dict) else {"error": str(v)}) for k, v in result.items()}
    _print(out)
    failed = [k for k, v in out.items() if "error" in v]
    if failed:
        sys.stderr.write(f"lab stop: could not reach {', '.join(failed)}\n")
        return 1
    return 0


def _cmd_parse_log(args: argparse.Namespace) -> int:
    from lab.engines import parse_log_file

    if not args.file.is_file():
        raise _Fail(f"no such log file: {args.file}")
    for event in parse_log_file(args.engine, args.file):
        _print(event)
    return 0


def _cmd_sim(args: argparse.Namespace) -> int:
    if args.sim_command == "catalog":
        # What a simulated lab that is not serving yet will hold: the catalog it writes
        # beside its inventory when it starts (the platform asks here, not in lab.sim).
        from lab.sim.lab import scenario_catalog
        from lab.sim.scenario import ScenarioError, load_scenario

        try:
            _print(scenario_catalog(load_scenario(args.scenario)).as_data())
        except (ScenarioError, OSError, ValueError) as exc:
            raise _Fail(f"--scenario {args.scenario}: {exc}") from exc
        return 0
    from lab.sim.cli import serve

    return serve(args.scenario, args.state_dir)


class _Fail(Exception):
    pass


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = _build_parser().parse_args(argv)
    handlers = {
        "facts": _cmd_facts,
        "launch": _cmd_launch,
        "stop": _cmd_stop,
        "parse-log": _cmd_parse_log,
        "sim": _cmd_sim,
    }
    from lab.inventory import InventoryError
    from lab.session import LabError
    from lab.ssh import SSHError

    expected: tuple[type[BaseException], ...] = (
        _Fail, InventoryError, LabError, SSHError, ValueError, OSError)
    try:
        return handlers[args.command](args)
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away; send what is left nowhere, quietly.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except expected as exc:
        sys.stderr.write(f"lab {args.command}: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
