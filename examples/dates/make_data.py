"""Dates from one format to another, minitfm's example of a pairs task:

    2026-11-22 -> 22 November 2026
    1907-03-05 -> 5 March 1907

Writes `train.tsv` (20,000 pairs) and `eval.tsv` (1,000 pairs, none of whose dates is in
train.tsv) beside this file, or into --out, from a fixed seed: the same files on every machine.
Dates are uniform over 1900-01-01..2099-12-31. Standard library only:

    python examples/dates/make_data.py [--out DIR] [--seed N] [--train N] [--eval N]
"""

from __future__ import annotations

import argparse
import datetime
import random
from pathlib import Path

# Written out: calendar.month_name follows the locale.
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August",
          "September", "October", "November", "December")
FIRST, LAST = datetime.date(1900, 1, 1), datetime.date(2099, 12, 31)


def pair(day: datetime.date) -> tuple[str, str]:
    """ISO 8601 -> day (no leading zero), month name, year."""
    return day.isoformat(), f"{day.day} {MONTHS[day.month - 1]} {day.year}"


def draw_days(n: int, seed: int) -> list[datetime.date]:
    """`n` distinct days, in random order."""
    span = (LAST - FIRST).days + 1
    return [FIRST + datetime.timedelta(days=k) for k in random.Random(seed).sample(range(span), n)]


def write_tsv(path: Path, days: list[datetime.date]) -> None:
    path.write_text("".join("\t".join(pair(day)) + "\n" for day in days), encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).parent,
                        help="folder for train.tsv and eval.tsv (default: this file's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--train", type=int, default=20_000, help="training pairs")
    parser.add_argument("--eval", type=int, default=1_000, help="held-out pairs")
    args = parser.parse_args()
    days = draw_days(args.train + args.eval, args.seed)  # distinct: eval never meets train
    args.out.mkdir(parents=True, exist_ok=True)
    write_tsv(args.out / "train.tsv", days[:args.train])
    write_tsv(args.out / "eval.tsv", days[args.train:])
    print(f"wrote {args.out / 'train.tsv'} ({args.train:,} pairs) and "
          f"{args.out / 'eval.tsv'} ({args.eval:,} pairs)")


if __name__ == "__main__":
    main()
