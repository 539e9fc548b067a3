"""A fictional world: people, places, organisations and events linked by relations.

Everything is invented (names are built from syllables), so a model cannot answer questions about
it from memory: it has to search. The world is a deterministic function of `(num_pages, seed)`.
"""

from __future__ import annotations

import bisect
import random
from collections.abc import Callable
from dataclasses import dataclass, field

KINDS = ("person", "city", "country", "organisation", "event")

# Relations (entity-valued attributes) per kind, with the kind they point to.
LINKS: dict[str, dict[str, str]] = {
    "person": {"birthplace": "city", "employer": "organisation", "mentor": "person"},
    "city": {"country": "country"},
    "country": {"capital": "city"},
    "organisation": {"founder": "person", "headquarters": "city"},
    "event": {"location": "city", "organiser": "organisation", "leader": "person"},
}
# Scalar attributes per kind; the numeric ones can be compared.
SCALARS: dict[str, tuple[str, ...]] = {
    "person": ("born", "died", "occupation"),
    "city": ("founded", "population"),
    "country": ("founded", "currency"),
    "organisation": ("founded", "sector"),
    "event": ("year", "category"),
}
NUMERIC = {"born", "died", "founded", "population", "year"}

_ONSETS = [
    "b",
    "br",
    "c",
    "d",
    "dr",
    "f",
    "g",
    "gr",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "st",
    "t",
    "th",
    "tr",
    "v",
    "w",
    "z",
]
_VOWELS = ["a", "e", "i", "o", "u", "a", "e", "i", "o", "a", "ia", "ei"]
_CODAS = ["", "", "", "", "n", "r", "l", "s", "th", "nd", "rk", "m", "v", "st", "ll", "rn"]
_CITY_SUFFIXES = ["", "", "", "ford", "holm", "ova", "mere", "burg", "wick", "ana", "port", "dale"]
_CURRENCY_UNITS = ["crown", "mark", "florin", "talar", "real", "ducat", "sol"]
_OCCUPATIONS = [
    "cartographer",
    "astronomer",
    "sculptor",
    "composer",
    "physician",
    "engineer",
    "poet",
    "botanist",
    "architect",
    "merchant",
    "diplomat",
    "chemist",
    "painter",
    "novelist",
    "mathematician",
    "shipwright",
    "historian",
    "linguist",
    "glassmaker",
    "surveyor",
]
_SECTORS = {
    "company": "Company",
    "university": "University",
    "guild": "Guild",
    "bank": "Bank",
    "orchestra": "Orchestra",
    "observatory": "Observatory",
    "shipping line": "Shipping Line",
    "newspaper": "Gazette",
    "museum": "Museum",
    "academy": "Academy",
}
_EVENTS = {
    "battle": "Battle of {place}",
    "treaty": "Treaty of {place}",
    "exhibition": "{place} Exhibition",
    "expedition": "{word} Expedition",
    "festival": "{place} Festival",
    "uprising": "{place} Uprising",
    "council": "Council of {place}",
    "fire": "Great Fire of {place}",
    "flood": "{place} Flood",
    "conference": "{word} Conference",
}


@dataclass
class Entity:
    """One encyclopedia subject; it becomes one page.

    Attributes:
        doc_id: The page id (`d000042`), assigned in a shuffled order so ids say nothing about
            the kind.
        kind: One of `KINDS`.
        name: The page title, unique in the world.
        scalars: Scalar attributes (years, counts, labels).
        links: Relation name -> `doc_id` of the entity it points to.
        pronoun: `he`/`she` for people, `it` otherwise.
    """

    doc_id: str
    kind: str
    name: str
    scalars: dict[str, int | str] = field(default_factory=dict)
    links: dict[str, str] = field(default_factory=dict)
    pronoun: str = "it"

    @property
    def phrase(self) -> str:
        """How the entity reads inside a sentence ("the Treaty of X", "Ada Voss")."""
        if self.kind in ("organisation", "event") or self.name.startswith(("Republic", "Kingdom")):
            return f"the {self.name}"
        return self.name


@dataclass
class World:
    """All entities, by page id, plus the ids grouped by kind."""

    entities: dict[str, Entity]
    by_kind: dict[str, list[str]]
    seed: int

    def get(self, doc_id: str) -> Entity:
        """The entity with page id `doc_id`."""
        return self.entities[doc_id]


class _Builder:
    """Adds entities to a world under construction, drawing from one random stream."""

    def __init__(self, num_pages: int, seed: int) -> None:
        self.rng = random.Random(f"world-{seed}")
        numbers = list(range(num_pages))
        self.rng.shuffle(numbers)
        self._numbers = iter(numbers)
        self._used_names: set[str] = set()
        self.entities: dict[str, Entity] = {}
        self.by_kind: dict[str, list[str]] = {kind: [] for kind in KINDS}

    def word(self, syllables: int) -> str:
        """A pronounceable invented word."""
        rng = self.rng
        parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)]
        parts += [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables - 2)]
        parts.append(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS))
        word = "".join(parts)
        for letter in set(word):
            word = word.replace(letter * 3, letter * 2)
        return word.capitalize()

    def add(self, kind: str, make_name: Callable[[], str], pronoun: str = "it") -> Entity:
        """Adds an entity whose name (drawn from `make_name`) is unique in the world."""
        for _ in range(1000):
            name = make_name()
            if name not in self._used_names:
                break
        else:
            raise RuntimeError("ran out of unique names; lower the number of pages")
        self._used_names.add(name)
        entity = Entity(f"d{next(self._numbers):06d}", kind, name, pronoun=pronoun)
        self.entities[entity.doc_id] = entity
        self.by_kind[kind].append(entity.doc_id)
        return entity

    def add_countries(self, count: int) -> None:
        rng = self.rng
        for _ in range(count):
            style = rng.random()
            prefix = "Republic of " if style < 0.2 else "Kingdom of " if style < 0.35 else ""
            country = self.add("country", lambda p=prefix: p + self.word(rng.choice((2, 2, 3))))
            country.scalars["founded"] = rng.randint(1200, 1800)
            unit = rng.choice(_CURRENCY_UNITS)
            country.scalars["currency"] = f"{self.word(2).lower()} {unit}"

    def add_cities(self, count: int) -> None:
        rng = self.rng
        countries = self.by_kind["country"]
        for index in range(count):
            city = self.add(
                "city", lambda: self.word(rng.choice((2, 2, 3))) + rng.choice(_CITY_SUFFIXES)
            )
            # The first cities go one per country, so every country has a capital.
            country_id = countries[index] if index < len(countries) else rng.choice(countries)
            city.links["country"] = country_id
            city.scalars["founded"] = rng.randint(900, 1850)
            city.scalars["population"] = int(10 ** rng.uniform(3.3, 6.5))
            if index < len(countries):
                self.entities[country_id].links["capital"] = city.doc_id

    def add_people(self, count: int) -> None:
        rng = self.rng
        first_names = [self.word(2) for _ in range(max(50, count // 8))]
        cities = self.by_kind["city"]
        people: list[Entity] = []
        for _ in range(count):
            person = self.add(
                "person",
                lambda: f"{rng.choice(first_names)} {self.word(rng.choice((2, 3)))}",
                pronoun=rng.choice(("he", "she")),
            )
            born = rng.randint(1600, 1960)
            person.scalars["born"] = born
            person.scalars["died"] = min(2020, born + rng.randint(28, 95))
            person.scalars["occupation"] = rng.choice(_OCCUPATIONS)
            person.links["birthplace"] = rng.choice(cities)
            people.append(person)
        people.sort(key=lambda p: (p.scalars["born"], p.doc_id))
        years = [int(p.scalars["born"]) for p in people]
        for person in people:
            born = int(person.scalars["born"])
            low = bisect.bisect_left(years, born - 45)
            high = bisect.bisect_right(years, born - 15)
            if high > low and rng.random() < 0.7:
                person.links["mentor"] = people[rng.randrange(low, high)].doc_id

    def _orgs_by_founding(self) -> tuple[list[str], list[int]]:
        orgs = sorted(
            self.by_kind["organisation"], key=lambda o: (self.entities[o].scalars["founded"], o)
        )
        return orgs, [int(self.entities[o].scalars["founded"]) for o in orgs]

    def add_organisations(self, count: int) -> None:
        rng = self.rng
        for _ in range(count):
            sector = rng.choice(sorted(_SECTORS))
            hq_id = rng.choice(self.by_kind["city"])

            def make(sector: str = sector, hq: str = self.entities[hq_id].name) -> str:
                root = hq if rng.random() < 0.3 else self.word(rng.choice((2, 3)))
                if sector == "university" and rng.random() < 0.5:
                    return f"University of {root}"
                return f"{root} {_SECTORS[sector]}"

            organisation = self.add("organisation", make)
            founder = self.entities[rng.choice(self.by_kind["person"])]
            organisation.links["founder"] = founder.doc_id
            organisation.links["headquarters"] = hq_id
            organisation.scalars["sector"] = sector
            founded = int(founder.scalars["born"]) + rng.randint(22, 60)
            organisation.scalars["founded"] = min(2015, founded)
        orgs, founded_years = self._orgs_by_founding()
        for person_id in self.by_kind["person"]:
            person = self.entities[person_id]
            high = bisect.bisect_right(founded_years, int(person.scalars["born"]) + 40)
            if high and rng.random() < 0.8:
                person.links["employer"] = orgs[rng.randrange(max(0, high - 200), high)]

    def add_events(self, count: int) -> None:
        rng = self.rng
        orgs, founded_years = self._orgs_by_founding()
        cities, people = self.by_kind["city"], self.by_kind["person"]
        for _ in range(count):
            category = rng.choice(sorted(_EVENTS))
            location_id = rng.choice(cities)

            def make(category: str = category, location_id: str = location_id) -> str:
                place_id = location_id if rng.random() < 0.7 else rng.choice(cities)
                place = self.entities[place_id].name
                return _EVENTS[category].format(place=place, word=self.word(2))

            event = self.add("event", make)
            year = rng.randint(1650, 2010)
            event.scalars["year"] = year
            event.scalars["category"] = category
            event.links["location"] = location_id
            high = bisect.bisect_right(founded_years, year)
            if high:
                event.links["organiser"] = orgs[rng.randrange(max(0, high - 200), high)]
            for _ in range(30):
                leader = self.entities[rng.choice(people)]
                if int(leader.scalars["born"]) + 18 <= year <= int(leader.scalars["died"]):
                    event.links["leader"] = leader.doc_id
                    break


def _counts(num_pages: int) -> dict[str, int]:
    countries = max(4, num_pages // 150)
    cities = max(countries * 2, num_pages * 15 // 100)
    organisations = max(4, num_pages * 17 // 100)
    events = max(4, num_pages * 15 // 100)
    people = num_pages - countries - cities - organisations - events
    if people < 8:
        raise ValueError(f"num_pages={num_pages} is too small for a world; use at least 100")
    return {
        "country": countries,
        "city": cities,
        "organisation": organisations,
        "event": events,
        "person": people,
    }


def build_world(num_pages: int, seed: int = 0) -> World:
    """Generates a world with exactly `num_pages` entities.

    Args:
        num_pages: Number of entities (= encyclopedia pages), 100 to a few 100k.
        seed: The random seed; the same `(num_pages, seed)` always gives the same world.

    Returns:
        The world.

    Example:
        >>> world = build_world(200, seed=1)
        >>> len(world.entities)
        200
    """
    counts = _counts(num_pages)
    builder = _Builder(num_pages, seed)
    builder.add_countries(counts["country"])
    builder.add_cities(counts["city"])
    builder.add_people(counts["person"])
    builder.add_organisations(counts["organisation"])
    builder.add_events(counts["event"])
    return World(entities=builder.entities, by_kind=builder.by_kind, seed=seed)
