"""The demo's and compare's number flags: a nonsensical count (`--steps -3`) is argparse's
one-line error under the command's own usage, before anything starts."""
from __future__ import annotations

import argparse


def at_least(low):
    """An argparse type: a number of low's type (int or float) that is >= low, else
    argparse's one-line error with the command's own usage."""
    kind = type(low)

    def number(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a{'n integer' if kind is int else ' number'}: "
                                             f"{text!r}") from None
        if not value >= low:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        return value

    number.__name__ = "count" if kind is int else "number"
    return number
