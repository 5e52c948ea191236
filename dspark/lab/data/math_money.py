"""Math word-problem templates about money: shopping with change, saving, discounts, packs, wages, fruit, pizza
and books bought. Each is registered with `_template` (math_words.py) and returns (question, worked `_Work`)."""

from __future__ import annotations

import random
from math import gcd

from dspark.lab.data.math_words import _join, _person, _template, _Work


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
