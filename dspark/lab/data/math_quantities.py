"""Math word-problem templates about quantities: sharing, speed, recipes, areas, ages, unit conversions, tiles,
trains, buses and harvests. Each is registered with `_template` (math_words.py) and returns (question, worked
`_Work`)."""

from __future__ import annotations

import random
from math import gcd

from dspark.lab.data.math_words import _person, _template, _Work


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
