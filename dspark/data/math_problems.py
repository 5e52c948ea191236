"""Seeded, offline generator of grade-school multi-step math word problems.

Each problem is a short English question plus a worked solution: one line per
arithmetic step, each a plain sentence holding one explicit equation such as
``3 * 4 = 12``, followed by a final line ``The answer is N.``. About twenty
templates (shopping with change, sharing, speed and distance, recipes, savings,
areas, ages, unit conversions, trains, ...) are filled with random names, items
and numbers. Numbers are chosen so that every intermediate and final result is
a non-negative integer: every division is exact by construction, and `_Work`
refuses an inexact one rather than round.

This stands in for the paper's math evaluation domain (GSM8K / MATH style
problems) at our scale: a ~6M parameter model cannot learn GSM8K, but it can
learn this narrow, regular, step-by-step format, which is what makes the math
domain easy for a draft model to predict.

What this file does not do: it is not GSM8K and holds no real data set, it
downloads nothing, and it does not check answers written by a model (the
answer line is simply "The answer is N.", easy to parse if needed). Only the
standard library is used; everything is deterministic given the `random.Random`
state.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from math import gcd
from typing import NamedTuple

__all__ = ["TEMPLATES", "generate_problem", "generate_problems"]

_FEMALE = (
    "Maya", "Emma", "Olivia", "Ava", "Sofia", "Mia", "Lena", "Priya", "Aisha",
    "Grace", "Chloe", "Nora", "Zara", "Hana", "Lucy", "Ruth", "Elena", "Fatima",
    "Ines", "Yuki",
)  # fmt: skip
_MALE = (
    "Liam", "Noah", "Omar", "Ravi", "Ethan", "Lucas", "Mateo", "Kenji", "Samuel",
    "Diego", "Felix", "Hugo", "Jonah", "Arjun", "Tom", "Ben", "Marco", "Ivan",
    "Kofi", "Leo",
)  # fmt: skip


class _Person(NamedTuple):
    name: str
    subj: str  # she / he
    obj: str  # her / him
    poss: str  # her / his
    refl: str  # herself / himself

    @property
    def cap(self) -> str:
        """The subject pronoun capitalised, for the start of a sentence."""
        return self.subj.capitalize()


def _person(rng: random.Random, exclude: tuple[str, ...] = ()) -> _Person:
    """A random person whose name is not in `exclude`."""
    while True:
        if rng.random() < 0.5:
            person = _Person(rng.choice(_FEMALE), "she", "her", "her", "herself")
        else:
            person = _Person(rng.choice(_MALE), "he", "him", "his", "himself")
        if person.name not in exclude:
            return person


def _apply(a: int, op: str, b: int) -> int:
    """Evaluate `a op b`, refusing anything that would leave the integers >= 0."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        if b > a:
            raise ValueError(f"negative result: {a} - {b}")
        return a - b
    if op == "/":
        if b == 0 or a % b:
            raise ValueError(f"inexact division: {a} / {b}")
        return a // b
    raise ValueError(f"unknown operator {op!r}")


def _singular(unit: str) -> str:
    """'1 dollars left' -> '1 dollar left': singularise the unit's first plural."""
    words = unit.split(" ")
    for i, word in enumerate(words):
        if word.endswith("ies"):
            words[i] = word[:-3] + "y"
        elif word.endswith(("oes", "xes")):
            words[i] = word[:-2]
        elif word.endswith("s"):
            words[i] = word[:-1]
        else:
            continue
        break
    return " ".join(words)


class _Work:
    """Collects solution lines; each step is one sentence with one equation."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.last = 0

    def step(self, text: str, a: int, op: str, b: int, unit: str = "") -> int:
        """Append "<text> a op b = c <unit>." and return c."""
        c = _apply(a, op, b)
        tail = f" {_singular(unit) if c == 1 else unit}" if unit else ""
        self.lines.append(f"{text} {a} {op} {b} = {c}{tail}.")
        self.last = c
        return c

    def solution(self) -> str:
        """All step lines plus the answer line (the last step's result)."""
        return "\n".join([*self.lines, f"The answer is {self.last}."])


_Template = Callable[[random.Random], tuple[str, _Work]]
_REGISTRY: dict[str, _Template] = {}


def _template(name: str) -> Callable[[_Template], _Template]:
    def register(fn: _Template) -> _Template:
        _REGISTRY[name] = fn
        return fn

    return register


def _join(parts: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


# --------------------------------------------------------------------- templates


@_template("shopping_change")
def _shopping(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    goods = (
        "notebooks",
        "pens",
        "apples",
        "muffins",
        "rulers",
        "comic books",
        "juice boxes",
        "candles",
        "toy cars",
        "sandwiches",
    )
    items = rng.sample(goods, rng.choice((1, 2, 3)))
    counts = [rng.randint(2, 5) for _ in items]
    prices = [rng.randint(2, 9) for _ in items]
    w = _Work()
    costs = [
        w.step(
            f"{p.name} buys {n} {it} at {c} dollars each, so {p.subj} pays",
            n,
            "*",
            c,
            "dollars",
        )
        for it, n, c in zip(items, counts, prices, strict=True)
    ]
    total = costs[0]
    for cost in costs[1:]:
        total = w.step("Adding this to the rest, the total is", total, "+", cost, "dollars")
    bill = min(b for b in (10, 20, 50, 100, 200) if b > total)
    w.step(f"From {bill} dollars {p.subj} gets back", bill, "-", total, "dollars")
    bought = _join([f"{n} {it} for {c} dollars each" for it, n, c in zip(items, counts, prices)])
    q = rng.choice(
        (
            "{n} buys {b}. {P} pays with a {bill}-dollar bill. How much change does {s} get, in dollars?",
            "At the shop, {n} picks up {b}. {P} hands the cashier {bill} dollars. How many dollars of change should {s} get back?",
        )
    )
    return q.format(n=p.name, b=bought, P=p.cap, s=p.subj, bill=bill), w


@_template("sharing_equally")
def _sharing(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    box = rng.choice(("bags", "boxes", "jars", "packs"))
    item = rng.choice(("stickers", "marbles", "cookies", "candies", "crayons", "beads"))
    b, k = rng.randint(2, 6), rng.randint(4, 12)
    w = _Work()
    total = w.step(f"{p.name} has {b} {box} with {k} {item} each, so {p.subj} has", b, "*", k, item)
    if rng.random() < 0.5:
        m = rng.randint(2, min(6, total // 4))
        e = total % m
        e = e + m if e < 2 else e
        rest = w.step(f"{p.cap} keeps {e} for {p.refl}, which leaves", total, "-", e, item)
        keep = f" {p.cap} keeps {e} {item} for {p.refl} and shares the rest"
    else:
        m = rng.choice([d for d in range(2, 9) if total % d == 0 and d <= total // 2])
        rest, keep = total, f" {p.cap} shares them all"
    w.step(f"Shared among {m} friends, each friend gets", rest, "/", m, item)
    ask = rng.choice(("How many {i} does each friend get?", "How many {i} does each friend receive?"))
    one = {"bags": "bag", "boxes": "box", "jars": "jar", "packs": "pack"}[box]
    question = f"{p.name} has {b} {box} of {item}, with {k} {item} in each {one}."
    return question + keep + f" equally among {m} friends. " + ask.format(i=item), w


@_template("speed_distance")
def _speed(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    verb, lo, hi = rng.choice((("drives", 8, 18), ("cycles", 2, 5), ("rides a bus", 6, 12)))
    v1, v2 = 5 * rng.randint(lo, hi), 5 * rng.randint(lo, hi)
    t1, t2 = rng.randint(2, 4), rng.randint(2, 3)
    w = _Work()
    d1 = w.step(f"In the first part of the trip {p.subj} covers", v1, "*", t1, "km")
    d2 = w.step(f"In the second part {p.subj} covers", v2, "*", t2, "km")
    total = w.step(f"Altogether {p.subj} travels", d1, "+", d2, "km")
    q = f"{p.name} {verb} at {v1} km per hour for {t1} hours, then at {v2} km per hour for {t2} hours."
    if rng.random() < 0.5:
        trip = total + rng.randint(5, 60)
        w.step("The distance still left is", trip, "-", total, "km")
        return (
            q + f" The whole trip is {trip} km long. How many kilometers are left to go?",
            w,
        )
    return q + rng.choice(
        (
            " How many kilometers does {s} travel in total?",
            " How far does {s} go altogether, in km?",
        )
    ).format(s=p.subj), w


@_template("recipe_scaling")
def _recipe(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    dish = rng.choice(("pancakes", "muffins", "cookies", "waffles", "scones"))
    s, n = rng.randint(2, 6), rng.randint(2, 5)
    flour, sugar = 50 * rng.randint(2, 8), 25 * rng.randint(2, 8)
    w = _Work()
    w.step(f"{p.name} needs {s * n} {dish}, so the recipe is made", s * n, "/", s, "times")
    f = w.step("The flour needed is", flour, "*", n, "grams")
    q = f"A recipe for {s} {dish} uses {flour} grams of flour and {sugar} grams of sugar. {p.name} wants to make {s * n} {dish}."
    if rng.random() < 0.5:
        return q + f" How many grams of flour does {p.subj} need?", w
    g = w.step("The sugar needed is", sugar, "*", n, "grams")
    w.step("Together that is", f, "+", g, "grams")
    return q + f" How many grams of flour and sugar does {p.subj} need altogether?", w


@_template("savings_weeks")
def _savings(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    thing = rng.choice(("bike", "skateboard", "video game", "telescope", "guitar", "tent", "scooter"))
    x, y = rng.randint(2, 15), rng.randint(5, 40)
    w = _Work()
    if rng.random() < 0.5:
        weeks = rng.randint(3, 10)
        saved = w.step(f"In {weeks} weeks {p.subj} saves", x, "*", weeks, "dollars")
        have = w.step(
            f"With the {y} dollars {p.subj} already had, {p.subj} has",
            saved,
            "+",
            y,
            "dollars",
        )
        cost = rng.randint(have // 2, have - 2)
        w.step(f"After buying the {thing}, {p.subj} has", have, "-", cost, "dollars left")
        return (
            f"{p.name} saves {x} dollars every week for {weeks} weeks. {p.cap} already had {y} dollars"
            f" in {p.poss} piggy bank. Then {p.subj} buys a {thing} that costs {cost} dollars."
            f" How many dollars does {p.subj} have left?"
        ), w
    cost = y + x * rng.randint(2, 10)
    need = w.step(f"{p.cap} still needs", cost, "-", y, "dollars")
    w.step(f"Saving {x} dollars a week, that takes", need, "/", x, "weeks")
    return (
        f"{p.name} wants to buy a {thing} that costs {cost} dollars. {p.cap} has {y} dollars and saves"
        f" {x} dollars each week. How many weeks will it take {p.obj} to have exactly enough money?"
    ), w


@_template("rectangle_area_perimeter")
def _rectangle(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    length, width = rng.randint(6, 30), rng.randint(4, 15)
    w = _Work()
    if rng.random() < 0.5:
        half = w.step("Length plus width is", length, "+", width, "meters")
        per = w.step("The perimeter is twice that:", half, "*", 2, "meters")
        q = f"A rectangular garden is {length} meters long and {width} meters wide. {p.name} puts a fence all around it."
        if rng.random() < 0.5:
            return q + f" How many meters of fence does {p.subj} need?", w
        price = rng.randint(2, 9)
        w.step(f"At {price} dollars per meter the fence costs", per, "*", price, "dollars")
        return (
            q + f" Fence costs {price} dollars per meter. How many dollars does the fence cost?",
            w,
        )
    side = rng.randint(2, min(width - 1, 5))
    area = w.step("The whole lawn has an area of", length, "*", width, "square meters")
    bed = w.step("The flower bed takes up", side, "*", side, "square meters")
    grass = w.step("The grass covers", area, "-", bed, "square meters")
    q = (
        f"A rectangular lawn is {length} meters long and {width} meters wide. In the middle is a square"
        f" flower bed with sides of {side} meters."
    )
    if rng.random() < 0.5:
        return q + " How many square meters of grass are there?", w
    seed = rng.randint(2, 6)
    w.step(
        f"With {seed} grams per square meter, {p.name} needs",
        grass,
        "*",
        seed,
        "grams of seed",
    )
    return (
        q
        + f" {p.name} spreads {seed} grams of grass seed on each square meter of grass. How many grams of seed does {p.subj} use?",
        w,
    )


@_template("ages")
def _ages(rng: random.Random) -> tuple[str, _Work]:
    a = _person(rng)
    b = _person(rng, (a.name,))
    age, k = rng.randint(4, 12), rng.randint(2, 4)
    w = _Work()
    mode = rng.randrange(3)
    if mode < 2:
        older = w.step(
            f"{b.name} is {k} times as old as {a.name}, so {b.subj} is",
            age,
            "*",
            k,
            "years old",
        )
        if mode == 0:
            w.step("Together they are", age, "+", older, "years old")
            return (
                f"{a.name} is {age} years old. {b.name} is {k} times as old as {a.name}. What is the sum of their ages?",
                w,
            )
        c = _person(rng, (a.name, b.name))
        d = rng.randint(2, age + 2)
        third = w.step(
            f"{c.name} is {d} years younger than {b.name}, so {c.subj} is",
            older,
            "-",
            d,
            "years old",
        )
        pair = w.step(f"{a.name} and {b.name} together are", age, "+", older, "years old")
        w.step(f"Adding {c.name}, the total is", pair, "+", third, "years")
        return (
            f"{a.name} is {age} years old. {b.name} is {k} times as old as {a.name}, and {c.name} is {d} years"
            f" younger than {b.name}. How old are the three of them altogether?"
        ), w
    d, y = rng.randint(2, 9), rng.randint(2, 10)
    older = w.step(
        f"{b.name} is {d} years older than {a.name}, so {b.subj} is",
        age,
        "+",
        d,
        "years old",
    )
    fa = w.step(f"In {y} years {a.name} will be", age, "+", y, "years old")
    fb = w.step(f"In {y} years {b.name} will be", older, "+", y, "years old")
    w.step("Their ages will add up to", fa, "+", fb, "years")
    return (
        f"{a.name} is {age} years old and {b.name} is {d} years older. In {y} years, what will the sum of"
        " their ages be?"
    ), w


@_template("buying_packs")
def _packs(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    item, pack = rng.choice(
        (
            ("pencils", "box"),
            ("balloons", "bag"),
            ("paper cups", "pack"),
            ("candles", "box"),
            ("markers", "set"),
        )
    )
    size, price = rng.randint(4, 12), rng.randint(2, 9)
    w = _Work()
    if rng.random() < 0.5:
        n = size * rng.randint(2, 8)
        q = f"{p.name} needs {n} {item} for a party."
    else:
        tables, r = rng.randint(2, 6), rng.randint(1, 3)
        n = w.step(
            f"{tables} tables need {size * r} {item} each, so that is",
            tables,
            "*",
            size * r,
            item,
        )
        q = f"{p.name} is setting up {tables} tables for a party, and each table needs {size * r} {item}."
    packs = w.step(
        f"With {size} {item} in each {pack}, {p.subj} needs",
        n,
        "/",
        size,
        f"{pack}es" if pack.endswith("x") else f"{pack}s",
    )
    cost = w.step(f"At {price} dollars each, that costs", packs, "*", price, "dollars")
    q += f" The {item} come {size} to a {pack}, and each {pack} costs {price} dollars."
    if rng.random() < 0.5:
        return q + rng.choice(
            (" How much does {s} spend, in dollars?", " How many dollars does {s} pay?")
        ).format(s=p.subj), w
    bill = min(b for b in (20, 50, 100, 200, 500) if b > cost)
    w.step(f"Paying with {bill} dollars, {p.subj} gets back", bill, "-", cost, "dollars")
    return (
        q + f" {p.cap} pays with {bill} dollars. How many dollars of change does {p.subj} get?",
        w,
    )


@_template("percent_discount")
def _discount(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    item = rng.choice(("jacket", "pair of shoes", "lamp", "backpack", "board game", "watch"))
    rate = rng.choice((5, 10, 15, 20, 25, 30, 40, 50))
    unit = 100 // gcd(rate, 100)  # price must be a multiple of this for an exact discount
    price = unit * rng.randint(max(1, 20 // unit), 300 // unit)
    w = _Work()
    x = w.step(f"The discount is {rate} percent of {price}, so first compute", price, "*", rate)
    off = w.step("Dividing by 100 gives a discount of", x, "/", 100, "dollars")
    sale = w.step("The sale price is", price, "-", off, "dollars")
    q = rng.choice(
        (
            "A {i} costs {c} dollars. The store takes {r} percent off.",
            "The price of a {i} is {c} dollars, and it is on sale for {r} percent off.",
        )
    )
    q = q.format(i=item, c=price, r=rate)
    if rng.random() < 0.5:
        return q + f" How many dollars does {p.name} pay for it on sale?", w
    k = rng.randint(2, 4)
    w.step(f"For {k} of them {p.name} pays", sale, "*", k, "dollars")
    return (
        q + f" {p.name} buys {k} of them at the sale price. How many dollars does {p.subj} pay?",
        w,
    )


@_template("length_conversion")
def _length(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    thing = rng.choice(("ribbon", "rope", "string", "strip of paper"))
    meters = rng.randint(2, 9)
    cm = meters * 100
    piece = rng.choice([c for c in (4, 5, 10, 15, 20, 25, 30, 40, 50, 60, 75) if cm % c == 0])
    w = _Work()
    w.step(f"{meters} meters is", meters, "*", 100, "centimeters")
    pieces = w.step(f"Cutting pieces of {piece} cm gives", cm, "/", piece, "pieces")
    q = f"{p.name} has a {thing} that is {meters} meters long. {p.cap} cuts it into pieces that are each {piece} centimeters long."
    if pieces < 5 or rng.random() < 0.5:
        return q + f" How many pieces does {p.subj} get?", w
    g = rng.randint(2, pieces - 2)
    w.step(f"After giving away {g}, {p.subj} has", pieces, "-", g, "pieces left")
    return (
        q + f" Then {p.subj} gives {g} pieces to friends. How many pieces does {p.subj} have left?",
        w,
    )


@_template("time_conversion")
def _time(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    task = rng.choice(("practices the piano", "reads", "jogs", "studies", "plays chess"))
    w = _Work()
    if rng.random() < 0.5:
        mins = rng.choice((15, 20, 30, 40, 45, 90))
        unit = 60 // gcd(mins, 60)  # fewest days giving whole hours
        hours_per_unit = mins * unit // 60
        days = unit * rng.randint(-(-2 // hours_per_unit), 3)  # at least 2 hours
        total = w.step(f"Over {days} days {p.subj} spends", mins, "*", days, "minutes")
        hours = w.step("In hours that is", total, "/", 60, "hours")
        q = f"{p.name} {task} for {mins} minutes every day for {days} days."
        if rng.random() < 0.5:
            return q + f" How many hours does {p.subj} spend in total?", w
        extra = rng.randint(2, 5)
        w.step(f"Adding the {extra} hours on the weekend gives", hours, "+", extra, "hours")
        return (
            q + f" On the weekend {p.subj} also {task} for {extra} hours. How many hours is that altogether?",
            w,
        )
    h, m, days = rng.randint(2, 4), 5 * rng.randint(1, 11), rng.randint(2, 7)
    base = w.step(f"{h} hours is", h, "*", 60, "minutes")
    daily = w.step(f"Each day {p.subj} spends", base, "+", m, "minutes")
    w.step(f"Over {days} days that is", daily, "*", days, "minutes")
    return (
        f"{p.name} {task} for {h} hours and {m} minutes each day. How many minutes does {p.subj} spend in {days} days?",
        w,
    )


@_template("mass_conversion")
def _mass(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    food = rng.choice(("rice", "flour", "sugar", "coffee beans", "oats", "lentils"))
    kg, grams = rng.randint(2, 9), rng.choice((100, 125, 200, 250, 500))
    w = _Work()
    total = w.step(f"{kg} kilograms is", kg, "*", 1000, "grams")
    bags = w.step(f"In bags of {grams} grams that makes", total, "/", grams, "bags")
    q = f"{p.name} has a sack with {kg} kilograms of {food}. {p.cap} packs it into small bags of {grams} grams each."
    if rng.random() < 0.5:
        return q + " How many small bags can " + p.subj + " fill?", w
    price = rng.randint(2, 6)
    w.step(f"Selling each bag for {price} dollars earns", bags, "*", price, "dollars")
    return (
        q + f" {p.cap} sells every bag for {price} dollars. How many dollars does {p.subj} earn?",
        w,
    )


@_template("floor_tiles")
def _tiles(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    length, width = rng.randint(2, 6), rng.randint(3, 12)
    area = length * width
    cover = rng.choice([d for d in range(2, 7) if area % d == 0])
    price = rng.randint(10, 40)
    w = _Work()
    w.step("The floor has an area of", length, "*", width, "square meters")
    boxes = w.step(
        f"Each box covers {cover} square meters, so {p.subj} needs",
        area,
        "/",
        cover,
        "boxes",
    )
    q = (
        f"{p.name} is tiling a floor that is {length} meters by {width} meters. One box of tiles covers {cover}"
        f" square meters and costs {price} dollars."
    )
    if boxes >= 4 and rng.random() < 0.5:
        have = rng.randint(2, boxes - 2)
        boxes = w.step(
            f"{p.cap} already has {have} boxes, so {p.subj} buys",
            boxes,
            "-",
            have,
            "boxes",
        )
        q += f" {p.cap} already has {have} boxes at home."
    w.step(f"At {price} dollars a box, that costs", boxes, "*", price, "dollars")
    return q + rng.choice(
        (
            " How much does {s} spend on tiles, in dollars?",
            " How many dollars will the new tiles cost?",
        )
    ).format(s=p.subj), w


@_template("train_seats")
def _train(rng: random.Random) -> tuple[str, _Work]:
    cars, seats = rng.randint(3, 10), rng.randint(20, 60)
    total = cars * seats
    board = rng.randint(total // 3, total - 5)
    w = _Work()
    w.step("The train has", cars, "*", seats, "seats")
    q = f"A train has {cars} cars with {seats} seats in each car. At the first station {board} passengers get on."
    if rng.random() < 0.5:
        w.step("The number of empty seats is", total, "-", board, "seats")
        return q + " How many seats are still empty?", w
    off = rng.randint(2, board - 1)
    on = rng.randint(2, total - board + off)
    left = w.step(
        f"After {off} get off at the second station, there are",
        board,
        "-",
        off,
        "passengers",
    )
    riding = w.step(f"Then {on} get on, making", left, "+", on, "passengers")
    w.step("The empty seats are", total, "-", riding, "seats")
    return (
        q + f" At the second station {off} passengers get off and {on} get on. How many seats are empty now?",
        w,
    )


@_template("classroom_buses")
def _classroom(rng: random.Random) -> tuple[str, _Work]:
    w = _Work()
    if rng.random() < 0.5:
        while True:  # draw until the students split evenly into classes
            cap, buses, teachers = (
                rng.choice((20, 25, 30, 40, 45, 50)),
                rng.randint(2, 6),
                rng.randint(2, 9),
            )
            students = cap * buses - teachers
            sizes = [k for k in range(3, 9) if students % k == 0 and 15 <= students // k <= 35]
            if sizes:
                break
        classes = rng.choice(sizes)
        size = students // classes
        w.step("The number of students is", classes, "*", size, "students")
        people = w.step(f"With {teachers} teachers, the trip has", students, "+", teachers, "people")
        w.step(f"Each bus holds {cap}, so the school needs", people, "/", cap, "buses")
        return (
            f"A school has {classes} classes with {size} students each. All of them go on a trip with {teachers}"
            f" teachers. Each bus holds exactly {cap} people and every bus is full. How many buses are needed?"
        ), w
    classes, size = rng.randint(3, 8), rng.randint(18, 32)
    girls = rng.randint(5, size - 5)
    total = w.step("There are", classes, "*", size, "students in all")
    g = w.step("The number of girls is", classes, "*", girls, "girls")
    w.step("So the number of boys is", total, "-", g, "boys")
    return (
        f"A school has {classes} classes of {size} students. Each class has {girls} girls. How many boys are in the school?",
        w,
    )


@_template("fruit_basket")
def _fruit(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    apples, oranges, k = rng.randint(3, 15), rng.randint(2, 15), rng.randint(2, 3)
    w = _Work()
    bananas = w.step(f"There are {k} times as many bananas as apples:", apples, "*", k, "bananas")
    some = w.step("Apples and oranges together make", apples, "+", oranges, "fruits")
    total = w.step("Adding the bananas gives", some, "+", bananas, "fruits")
    times = "twice" if k == 2 else "three times"
    q = f"A basket holds {apples} apples and {oranges} oranges. It also has {times} as many bananas as apples."
    if rng.random() < 0.5:
        return q + " How many pieces of fruit are in the basket?", w
    eaten = rng.randint(2, total // 2)
    w.step(f"After {p.name} takes {eaten}, there are", total, "-", eaten, "fruits left")
    return (
        q + f" {p.name} takes {eaten} pieces of fruit. How many pieces of fruit are left in the basket?",
        w,
    )


@_template("book_reading")
def _book(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    rate, days = rng.randint(5, 30), rng.randint(2, 7)
    w = _Work()
    read = w.step(f"In {days} days {p.subj} reads", rate, "*", days, "pages")
    if rng.random() < 0.5:
        pages = read + rng.randint(10, 150)
        w.step("The pages left are", pages, "-", read, "pages")
        return (
            f"A book has {pages} pages. {p.name} reads {rate} pages a day for {days} days. How many pages are left to read?",
            w,
        )
    fast, more = rng.randint(10, 40), rng.randint(2, 6)
    pages = read + fast * more
    left = w.step("The pages left are", pages, "-", read, "pages")
    w.step(f"At {fast} pages a day, finishing takes", left, "/", fast, "days")
    return (
        f"{p.name}'s book has {pages} pages. {p.cap} reads {rate} pages a day for {days} days, then speeds up to"
        f" {fast} pages a day. How many more days does {p.subj} need to finish the book?"
    ), w


@_template("pizza_party")
def _pizza(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    slices, guests, each = (
        rng.choice((6, 8, 10, 12)),
        rng.randint(3, 12),
        rng.randint(2, 4),
    )
    pizzas = max(2, -(-(guests * each + 4) // slices)) + rng.randint(0, 2)
    w = _Work()
    total = w.step(f"{pizzas} pizzas have", pizzas, "*", slices, "slices")
    eaten = w.step(f"The {guests} guests eat", guests, "*", each, "slices")
    q = f"{p.name} orders {pizzas} pizzas, each cut into {slices} slices. Each of the {guests} guests eats {each} slices."
    if rng.random() < 0.5:
        own = rng.randint(2, 4)
        eaten = w.step(f"With the {own} slices {p.name} eats, that is", eaten, "+", own, "slices")
        q += f" {p.name} eats {own} slices too."
    w.step("The slices left over are", total, "-", eaten, "slices")
    return q + rng.choice((" How many slices are left over?", " How many slices are not eaten?")), w


@_template("hourly_wages")
def _wages(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    job = rng.choice(("at a bakery", "at a library", "walking dogs", "at a cafe", "in a garden"))
    pay, hours, days = rng.randint(8, 20), rng.randint(2, 8), rng.randint(2, 6)
    w = _Work()
    daily = w.step(f"Each day {p.subj} earns", pay, "*", hours, "dollars")
    total = w.step(f"In {days} days {p.subj} earns", daily, "*", days, "dollars")
    q = f"{p.name} works {job} for {hours} hours a day and earns {pay} dollars an hour. {p.cap} works {days} days."
    if rng.random() < 0.5:
        return q + f" How many dollars does {p.subj} earn?", w
    if rng.random() < 0.5:
        bonus = 5 * rng.randint(1, 6)
        total = w.step(f"With a {bonus}-dollar bonus {p.subj} has", total, "+", bonus, "dollars")
        q += f" {p.cap} also gets a bonus of {bonus} dollars."
    spend = rng.randint(5, total - 5)
    w.step(
        f"After spending {spend} dollars, {p.subj} has",
        total,
        "-",
        spend,
        "dollars left",
    )
    return (
        q + f" Then {p.subj} spends {spend} dollars. How many dollars does {p.subj} have left?",
        w,
    )


@_template("garden_harvest")
def _harvest(rng: random.Random) -> tuple[str, _Work]:
    p = _person(rng)
    crop = rng.choice(("tomatoes", "peppers", "carrots", "potatoes", "onions"))
    rows, plants, per = rng.randint(2, 8), rng.randint(3, 12), rng.randint(2, 9)
    harvest = rows * plants * per
    box = rng.choice([d for d in (4, 5, 6, 8, 10, 12) if harvest % d == 0] or [plants])
    w = _Work()
    n = w.step("The garden has", rows, "*", plants, "plants")
    total = w.step(f"Each plant gives {per} {crop}, so there are", n, "*", per, crop)
    boxes = w.step(f"Packed {box} to a box, that fills", total, "/", box, "boxes")
    q = f"{p.name} has {rows} rows of plants with {plants} plants in each row. Each plant gives {per} {crop}. {p.cap} packs them {box} to a box."
    if rng.random() < 0.5:
        return q + " How many boxes does " + p.subj + " fill?", w
    price = rng.randint(2, 9)
    w.step(f"At {price} dollars a box, {p.subj} earns", boxes, "*", price, "dollars")
    return (
        q + f" {p.cap} sells each box for {price} dollars. How many dollars does {p.subj} earn?",
        w,
    )


TEMPLATES: tuple[str, ...] = tuple(_REGISTRY)
"""Names of all problem templates, in registration order."""


def generate_problem(rng: random.Random, template: str | None = None) -> tuple[str, str]:
    """Return one (question, solution) pair drawn with `rng`.

    `template` picks a template by name (see `TEMPLATES`); None draws one
    uniformly. The solution has one line per arithmetic step and ends with
    the line "The answer is N.". Deterministic given the rng state.
    """
    name = rng.choice(TEMPLATES) if template is None else template
    if name not in _REGISTRY:
        raise ValueError(f"unknown template {name!r}; expected one of {TEMPLATES}")
    question, work = _REGISTRY[name](rng)
    return question, work.solution()


def generate_problems(n: int, seed: int) -> list[tuple[str, str]]:
    """Return `n` (question, solution) pairs from `random.Random(seed)`."""
    rng = random.Random(seed)
    return [generate_problem(rng) for _ in range(n)]
