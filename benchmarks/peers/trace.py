"""The 10-turn data-analysis trace every peer runs in one session, and its checks.

The cells are the same for every peer and use `print` wherever text is checked,
so a peer without a displayhook (a script runner) is not failed for that alone;
only turn 10 asks for the last expression's value. Turns 5-7 (chart, 1 MB,
error) need nothing from earlier turns, so a stateless peer is still tested on
them; the others build on turn 1's DataFrame, as an analysis does.

A check returns None when the output is right, else the reason it is not.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .base import Output, is_png

BIG = 1_000_000


@dataclass(frozen=True)
class Turn:
    title: str
    code: str
    check: Callable[[Output], str | None]


def _unexpected_error(out: Output) -> str | None:
    if out.error or out.error_text:
        last = (out.error_text.strip().splitlines() or [""])[-1].strip()
        name = out.error or "an error"
        return f"raised {last[:160]}" if last.startswith(name) else f"raised {name}: {last[:160]}"
    return None


def _stdout_is(expected: str) -> Callable[[Output], str | None]:
    def check(out: Output) -> str | None:
        if (why := _unexpected_error(out)) is not None:
            return why
        got = out.stdout.strip()
        return None if got == expected else f"stdout {got[:80]!r}, expected {expected!r}"

    return check


def check_png(out: Output) -> str | None:
    if (why := _unexpected_error(out)) is not None:
        return why
    if not out.images:
        return "no image came back"
    if not any(is_png(i) for i in out.images):
        return f"an image came back but not a PNG (first bytes {out.images[0][:8]!r})"
    return None


def check_big_print(out: Output) -> str | None:
    if (why := _unexpected_error(out)) is not None:
        return why
    got = out.stdout.strip()
    if len(got) != BIG or got.count("x") != BIG:
        return f"stdout has {len(got):,} characters ({got.count('x'):,} x), expected {BIG:,} x"
    return None


def check_key_error(out: Output) -> str | None:
    if out.error == "KeyError":
        return None
    if out.error:
        return f"the error came back as {out.error!r}, expected 'KeyError'"
    if "KeyError" in out.error_text:
        return "KeyError only inside free text, no error name reported"
    return "no error came back"


GROUP_MAX = "{'Kyiv': 6, 'Lima': 6, 'Oslo': 6, 'Pune': 6}"


def check_last_value(out: Output) -> str | None:
    if (why := _unexpected_error(out)) is not None:
        return why
    if out.result is None:
        return "the last expression's value did not come back (no displayhook)"
    got = out.result.strip()
    return None if got == GROUP_MAX else f"result {got[:80]!r}, expected {GROUP_MAX!r}"


TURNS: tuple[Turn, ...] = (
    Turn(
        "build a DataFrame",
        "import pandas as pd\n"
        'cities = ["Oslo", "Lima", "Pune", "Kyiv"]\n'
        "df = pd.DataFrame({\n"
        '    "city": [cities[i % 4] for i in range(1000)],\n'
        '    "sales": list(range(1000)),\n'
        '    "units": [i % 7 for i in range(1000)],\n'
        "})\n"
        "SEED = 424242\n"
        "print(df.shape)",
        _stdout_is("(1000, 3)"),
    ),
    Turn(
        "describe",
        'd = df.describe()\nprint(d.loc["mean", "sales"], d.loc["max", "units"])',
        _stdout_is("499.5 6.0"),
    ),
    Turn(
        "groupby sum",
        'print(df.groupby("city")["sales"].sum().to_dict())',
        _stdout_is("{'Kyiv': 125250, 'Lima': 124750, 'Oslo': 124500, 'Pune': 125000}"),
    ),
    Turn(
        "derived column",
        'df["big"] = df["sales"] >= 900\nprint(int(df["big"].sum()))',
        _stdout_is("100"),
    ),
    Turn(
        "matplotlib chart (PNG)",
        "import matplotlib.pyplot as plt\n"
        "fig, ax = plt.subplots(figsize=(6, 4), dpi=100)\n"
        'ax.bar(["Kyiv", "Lima", "Oslo", "Pune"], [125250, 124750, 124500, 125000])\n'
        'ax.set_title("sales by city")\n'
        "plt.show()",
        check_png,
    ),
    Turn("1 MB print", f'print("x" * {BIG:_})', check_big_print),
    Turn("an error (KeyError)", '{"a": 1}["missing"]', check_key_error),
    Turn(
        "alive after the error",
        'print(len(df), int(df["big"].sum()))',
        _stdout_is("1000 100"),
    ),
    Turn("a variable from turn 1", "print(SEED * 2)", _stdout_is("848484")),
    Turn(
        "last expression's value",
        'df.groupby("city")["units"].max().to_dict()',
        check_last_value,
    ),
)
