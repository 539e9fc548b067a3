"""Generated household layouts (rooms of receptacles) and object placements, ALFRED-style.

A *layout* is the furniture of one room (like an AI2-THOR floor plan): receptacles with
positions, plus a desk lamp in living rooms and bedrooms. It is a pure function of its name,
e.g. `kitchen-train-3`; train and test use different names, so test layouts are unseen. Objects
are placed per task. Receptacle/object classes and what can hold what come from alfworld's own
ALFRED tables (`alfworld.gen.constants`).
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

from alfworld.gen import constants

ROOMS = ("kitchen", "livingroom", "bedroom", "bathroom")
SIZES = ("small", "medium", "large")
OPENABLE = frozenset(constants.OPENABLE_CLASS_LIST)
CAN_CONTAIN: dict[str, frozenset[str]] = {
    receptacle: frozenset(objects)
    for receptacle, objects in constants.VAL_RECEPTACLE_OBJECTS.items()
}
LAMP_HOLDERS = ("SideTable", "Desk", "Dresser")

# Receptacle class -> (fewest, most) per room.
ROOM_RECEPTACLES: dict[str, dict[str, tuple[int, int]]] = {
    "kitchen": {
        "CounterTop": (1, 3),
        "Cabinet": (2, 10),
        "Drawer": (1, 6),
        "Fridge": (1, 1),
        "Microwave": (1, 1),
        "SinkBasin": (1, 1),
        "StoveBurner": (2, 4),
        "CoffeeMachine": (0, 1),
        "Toaster": (0, 1),
        "GarbageCan": (1, 1),
        "DiningTable": (0, 1),
        "Shelf": (0, 3),
        "SideTable": (0, 1),
    },
    "livingroom": {
        "Sofa": (1, 1),
        "ArmChair": (0, 2),
        "CoffeeTable": (0, 2),
        "SideTable": (1, 2),
        "TVStand": (0, 1),
        "Drawer": (0, 4),
        "Cabinet": (0, 4),
        "Shelf": (0, 4),
        "DiningTable": (0, 1),
        "Dresser": (0, 1),
        "GarbageCan": (0, 1),
        "Ottoman": (0, 1),
        "Safe": (0, 1),
    },
    "bedroom": {
        "Bed": (1, 1),
        "Desk": (0, 1),
        "Dresser": (0, 1),
        "SideTable": (1, 2),
        "Drawer": (1, 6),
        "Shelf": (0, 4),
        "ArmChair": (0, 1),
        "GarbageCan": (0, 1),
        "LaundryHamper": (0, 1),
        "Safe": (0, 1),
        "Cabinet": (0, 2),
    },
    "bathroom": {
        "Toilet": (1, 1),
        "SinkBasin": (1, 2),
        "BathtubBasin": (0, 1),
        "Cabinet": (1, 4),
        "CounterTop": (1, 1),
        "Drawer": (0, 4),
        "TowelHolder": (0, 1),
        "HandTowelHolder": (0, 2),
        "ToiletPaperHanger": (1, 1),
        "GarbageCan": (1, 1),
        "Shelf": (0, 2),
        "Dresser": (0, 1),
    },
}
ROOM_OBJECTS: dict[str, tuple[str, ...]] = {
    "kitchen": [
        "Apple",
        "Bowl",
        "Bread",
        "ButterKnife",
        "Cup",
        "DishSponge",
        "Egg",
        "Fork",
        "Glassbottle",
        "Kettle",
        "Knife",
        "Ladle",
        "Lettuce",
        "Mug",
        "Pan",
        "PepperShaker",
        "Plate",
        "Pot",
        "Potato",
        "SaltShaker",
        "SoapBottle",
        "Spatula",
        "Spoon",
        "Tomato",
        "WineBottle",
    ],
    "livingroom": [
        "Book",
        "Bowl",
        "Box",
        "Candle",
        "CellPhone",
        "CreditCard",
        "KeyChain",
        "Laptop",
        "Newspaper",
        "Pillow",
        "Plate",
        "RemoteControl",
        "Statue",
        "Vase",
        "Watch",
        "WateringCan",
    ],
    "bedroom": [
        "AlarmClock",
        "BaseballBat",
        "BasketBall",
        "Book",
        "Bowl",
        "Box",
        "CD",
        "CellPhone",
        "Cloth",
        "CreditCard",
        "KeyChain",
        "Laptop",
        "Mug",
        "Pen",
        "Pencil",
        "Pillow",
        "TennisRacket",
        "Watch",
    ],
    "bathroom": [
        "Candle",
        "Cloth",
        "DishSponge",
        "HandTowel",
        "Plunger",
        "SoapBar",
        "SoapBottle",
        "SprayBottle",
        "TissueBox",
        "ToiletPaper",
        "Towel",
    ],
}
# Layout size -> the fraction of each receptacle range used, and how often task objects hide
# inside closed receptacles.
_SIZE_FILL = {"small": (0.0, 0.3), "medium": (0.3, 0.7), "large": (0.7, 1.0)}
_HIDE_PROBABILITY = {"small": 0.15, "medium": 0.35, "large": 0.5}


def mangle(thor_id: str) -> str:
    """An AI2-THOR object id as ALFWorld writes it in PDDL (`Cabinet|+01.76|...` ->
    `Cabinet_bar__plus_01_dot_76...`); alfworld's demangler turns it back into `cabinet 1`."""
    table = {"-": "_minus_", "|": "_bar_", "+": "_plus_", ".": "_dot_", ",": "_comma_"}
    return "".join(table.get(character, character) for character in thor_id)


@dataclass(frozen=True)
class Receptacle:
    """A piece of furniture: PDDL id, ALFRED class and the location the agent goes to."""

    id: str
    cls: str
    location: str


@dataclass(frozen=True)
class Thing:
    """A movable object: PDDL id, ALFRED class and the receptacle it starts in."""

    id: str
    cls: str
    receptacle: str


@dataclass(frozen=True)
class Layout:
    """The furniture of one room.

    Attributes:
        name: `room-split-index`, e.g. `kitchen-test-2`; the layout is a function of it.
        room: One of `ROOMS`.
        size: One of `SIZES`.
        receptacles: The receptacles, in a fixed order.
        lamps: Desk lamps (toggleable, not pickupable), living rooms and bedrooms only.
        start: The agent's start location (the middle of the room).
    """

    name: str
    room: str
    size: str
    receptacles: tuple[Receptacle, ...]
    lamps: tuple[Thing, ...]
    start: str

    def classes(self) -> set[str]:
        """Receptacle classes present."""
        return {receptacle.cls for receptacle in self.receptacles}

    def of_class(self, cls: str) -> list[Receptacle]:
        """Receptacles of one class."""
        return [receptacle for receptacle in self.receptacles if receptacle.cls == cls]


class _Coordinates:
    """Unique AI2-THOR-looking coordinates and grid locations from one random stream."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._used: set[str] = set()

    def thor_id(self, cls: str, suffix: str = "") -> str:
        while True:
            xyz = "|".join(f"{self._rng.uniform(-3.5, 3.5):+06.2f}" for _ in range(3))
            if xyz not in self._used:
                self._used.add(xyz)
                return mangle(f"{cls}|{xyz}{suffix}")

    def location(self) -> str:
        while True:
            rng = self._rng
            grid = (rng.randint(-12, 12), rng.randint(-12, 12), rng.randint(0, 3))
            loc = f"loc|{grid[0]}|{grid[1]}|{grid[2]}|{rng.choice((0, 15, 30, 45, 60))}"
            if loc not in self._used:
                self._used.add(loc)
                return mangle(loc)


def make_layout(name: str) -> Layout:
    """The layout called `name` (`room-split-index`; the index sets the size: small, medium,
    large, small, ...).

    Args:
        name: E.g. `kitchen-train-0`. Any suffix works; the same name is the same layout.

    Returns:
        The layout.

    Raises:
        ValueError: If the name does not start with a known room.

    Example:
        >>> layout = make_layout("kitchen-train-0")
        >>> "Fridge" in layout.classes()
        True
    """
    room = name.split("-", 1)[0]
    if room not in ROOMS:
        raise ValueError(f"unknown room {room!r} in layout {name!r}; rooms are {', '.join(ROOMS)}")
    rng = random.Random(f"layout-{name}")
    # Sizes cycle with a numeric suffix, so any run of layouts spreads difficulty evenly.
    suffix = name.rsplit("-", 1)[-1]
    size = SIZES[int(suffix) % len(SIZES)] if suffix.isdigit() else rng.choice(SIZES)
    coordinates = _Coordinates(rng)
    low, high = _SIZE_FILL[size]
    receptacles = []
    for cls, (fewest, most) in ROOM_RECEPTACLES[room].items():
        count = fewest + round((most - fewest) * rng.uniform(low, high))
        for _ in range(count):
            # ALFRED names basins after their sink/bathtub: "Sink|...|SinkBasin".
            if cls in ("SinkBasin", "BathtubBasin"):
                thor_id = coordinates.thor_id(cls.removesuffix("Basin"), f"|{cls}")
            else:
                thor_id = coordinates.thor_id(cls)
            receptacles.append(Receptacle(thor_id, cls, coordinates.location()))
    rng.shuffle(receptacles)
    lamps: list[Thing] = []
    holders = [r for r in receptacles if r.cls in LAMP_HOLDERS]
    if room in ("livingroom", "bedroom") and holders:
        lamps.append(Thing(coordinates.thor_id("DeskLamp"), "DeskLamp", rng.choice(holders).id))
    return Layout(name, room, size, tuple(receptacles), tuple(lamps), coordinates.location())


def holders_of(layout: Layout, cls: str) -> list[Receptacle]:
    """Receptacles in the layout that can hold an object class."""
    return [r for r in layout.receptacles if cls in CAN_CONTAIN.get(r.cls, ())]


def hide_probability(layout: Layout) -> float:
    """How often a task object starts inside a closed receptacle in this layout."""
    return _HIDE_PROBABILITY[layout.size]


def place(
    layout: Layout,
    rng: random.Random,
    cls: str,
    avoid: Collection[str] = (),
    hide: float = 0.0,
) -> Receptacle:
    """A receptacle for an object of class `cls`, not of a class in `avoid`.

    With probability `hide` it is a closed (openable) receptacle when the room has one.
    """
    options = [r for r in holders_of(layout, cls) if r.cls not in avoid]
    if not options:
        raise ValueError(f"no receptacle in {layout.name} can hold a {cls}")
    closed = [r for r in options if r.cls in OPENABLE]
    if closed and rng.random() < hide:
        return rng.choice(closed)
    return rng.choice(options)
