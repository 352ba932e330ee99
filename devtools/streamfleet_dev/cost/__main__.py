"""``python -m streamfleet_dev.cost --streams N --msg-per-s R --subscribers S --regions G``:
the monthly bill by component (``make cost`` passes ``STREAMS``, ``MSG_PER_S``,
``SUBSCRIBERS``, ``REGIONS``, ``MESSAGE_BYTES`` and ``BATCHING_WINDOW``)."""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from typing import NoReturn

from streamfleet_dev import assembly
from streamfleet_dev.cost.bill import Line, Workload, bill, load_measured, load_prices
from streamfleet_dev.cost.deployment import read_deployment, retention_seconds


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


class _Parser(argparse.ArgumentParser):
    """Bad input is one line naming the field, nothing else."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"make cost: {message}\n")


def parse(argv: list[str]) -> Workload:
    parser = _Parser(prog="make cost", description=__doc__)
    parser.add_argument("--streams", type=_whole, required=True)
    parser.add_argument("--msg-per-s", type=_number, required=True, help="per stream")
    parser.add_argument("--subscribers", type=_whole, required=True, help="per stream")
    parser.add_argument("--regions", type=_whole, default=2)
    parser.add_argument("--message-bytes", type=_whole, default=200)
    parser.add_argument("--batching-window", default="none", help="none or 0.5 (seconds)")
    args = parser.parse_args(argv)
    try:
        return Workload(
            streams=args.streams,
            msg_per_s=args.msg_per_s,
            message_bytes=args.message_bytes,
            subscribers=args.subscribers,
            regions=args.regions,
            batching_window=args.batching_window,
        )
    except ValueError as exc:
        parser.error(str(exc))


def render(workload: Workload, lines: list[Line], prices: dict) -> str:
    out = [
        f"Monthly bill (30 days): {workload.streams:,} streams x {workload.msg_per_s:g} msg/s "
        f"of {workload.message_bytes} B, {workload.subscribers} subscribers each, "
        f"{workload.regions} Region(s), fan-out batching window {workload.batching_window}",
        f"Prices: {prices['price_list']}, as of {prices['as_of']} ({prices['checked']}).",
        "",
        f"{'component':<15} {'item':<52} {'quantity':>16} {'unit':<22} {'USD':>12}  source",
    ]
    for line in lines:
        out.append(
            f"{line.component:<15} {line.item[:52]:<52} {line.quantity:>16,.1f} "
            f"{line.unit[:22]:<22} {line.usd:>12,.2f}  {line.source}"
        )
    totals: dict[str, float] = defaultdict(float)
    for line in lines:
        totals[line.component] += line.usd
    total = sum(totals.values())
    out += ["", "By component:"]
    for component, usd in sorted(totals.items(), key=lambda kv: -kv[1]):
        share = usd / total * 100 if total else 0.0
        out.append(f"  {component:<15} {usd:>14,.2f} USD  {share:5.1f} %")
    out.append(f"  {'total':<15} {total:>14,.2f} USD")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    workload = parse(sys.argv[1:] if argv is None else argv)
    cloud = assembly.default_assembly()
    prices = load_prices()
    lines = bill(
        workload,
        read_deployment(cloud),
        prices,
        load_measured(),
        retention_seconds=retention_seconds(cloud),
    )
    print(render(workload, lines, prices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
