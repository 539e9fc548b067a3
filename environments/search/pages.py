"""Renders a world's entities as encyclopedia pages: an infobox of `Key: value` lines + prose."""

from __future__ import annotations

import random

from environments.search.corpus import Document
from environments.search.world import Entity, World

# Infobox label of each attribute; the scripted solver reads these lines.
LABELS = {
    "born": "Born",
    "died": "Died",
    "occupation": "Occupation",
    "birthplace": "Birthplace",
    "employer": "Employer",
    "mentor": "Mentor",
    "country": "Country",
    "founded": "Founded",
    "population": "Population",
    "capital": "Capital",
    "currency": "Currency",
    "founder": "Founder",
    "headquarters": "Headquarters",
    "sector": "Sector",
    "year": "Year",
    "location": "Location",
    "organiser": "Organiser",
    "leader": "Leader",
    "category": "Category",
}

_LEGACY = [
    "{P} is remembered for a treatise on {w} {topic}.",
    "A street in {city} is named after {them}.",
    "{P} kept detailed notebooks on {w} {topic}, published after {their} death.",
    "Letters by {them} are held in the archive of {city}.",
    "Contemporaries described {them} as patient and exacting.",
]
_TOPICS = [
    "tides",
    "lenses",
    "bridges",
    "dyes",
    "comets",
    "ferns",
    "harbours",
    "bells",
    "maps",
    "canals",
    "clocks",
]


def value_text(world: World, entity: Entity, key: str) -> str:
    """The value of one attribute as text (a linked entity's name, or the scalar)."""
    if key in entity.links:
        return world.get(entity.links[key]).name
    return str(entity.scalars[key])


def _infobox(world: World, entity: Entity) -> list[str]:
    lines = [f"Type: {entity.kind}"]
    for key in (*entity.scalars, *entity.links):
        lines.append(f"{LABELS[key]}: {value_text(world, entity, key)}")
    return lines


def _person(world: World, person: Entity, rng: random.Random) -> list[str]:
    name, s = person.name, person.scalars
    surname = name.split()[-1]
    they = person.pronoun
    their = "his" if they == "he" else "her"
    them = "him" if they == "he" else "her"
    birthplace = world.get(person.links["birthplace"])
    country = world.get(birthplace.links["country"])
    text = [
        rng.choice(
            [
                f"{name} ({s['born']}–{s['died']}) was a {s['occupation']} born in "
                f"{birthplace.name}, {country.name}.",
                f"{name} was a {s['occupation']} from {birthplace.name}, born in {s['born']}"
                f" and died in {s['died']}.",
            ]
        )
    ]
    if "employer" in person.links:
        employer = world.get(person.links["employer"]).phrase
        text.append(
            rng.choice(
                [
                    f"{surname} worked for {employer} for most of {their} career.",
                    f"For many years {they} was employed by {employer}.",
                ]
            )
        )
    if "mentor" in person.links:
        mentor = world.get(person.links["mentor"]).name
        text.append(
            rng.choice(
                [f"{surname} trained under {mentor}.", f"{their.capitalize()} mentor was {mentor}."]
            )
        )
    city = world.get(rng.choice(world.by_kind["city"])).name
    legacy = rng.choice(_LEGACY).format(
        P=surname,
        w=rng.choice(["early", "northern", "forgotten", "coastal"]),
        topic=rng.choice(_TOPICS),
        city=city,
        them=them,
        their=their,
    )
    text.append(legacy[0].upper() + legacy[1:])
    return text


def _mentions(world: World) -> dict[tuple[str, str], list[str]]:
    """Reverse links: (target id, relation) -> names of up to 3 entities that point to it."""
    mentioned: dict[tuple[str, str], list[str]] = {}
    for doc_id in sorted(world.entities):
        entity = world.entities[doc_id]
        for key, target in entity.links.items():
            names = mentioned.setdefault((target, key), [])
            if len(names) < 3:
                names.append(entity.name)
    return mentioned


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def _prose(
    world: World,
    entity: Entity,
    rng: random.Random,
    mentioned: dict[tuple[str, str], list[str]],
) -> list[str]:
    s = entity.scalars

    def link(key: str) -> Entity:
        return world.get(entity.links[key])

    if entity.kind == "person":
        return _person(world, entity, rng)
    if entity.kind == "city":
        country = link("country")
        text = [
            f"{entity.name} is a city in {country.phrase}, founded in {s['founded']}.",
            f"It has a population of {int(s['population']):,}.",
        ]
        if country.links.get("capital") == entity.doc_id:
            text.append(f"{entity.name} is the capital of {country.phrase}.")
        if natives := mentioned.get((entity.doc_id, "birthplace")):
            text.append(f"Notable people born in {entity.name} include {_listing(natives)}.")
        return text
    if entity.kind == "country":
        phrase = entity.phrase[0].upper() + entity.phrase[1:]
        return [
            f"{phrase} is a country established in {s['founded']}.",
            f"Its capital is {link('capital').name} and its currency is the {s['currency']}.",
            *(
                [f"Other cities include {_listing(cities)}."]
                if (cities := mentioned.get((entity.doc_id, "country")))
                else []
            ),
        ]
    if entity.kind == "organisation":
        founder, hq = link("founder"), link("headquarters")
        return [
            f"The {entity.name} is a {s['sector']} founded in {s['founded']} by {founder.name}.",
            rng.choice(
                [f"It is headquartered in {hq.name}.", f"Its headquarters are in {hq.name}."]
            ),
            *(
                [f"Its staff have included {_listing(staff)}."]
                if (staff := mentioned.get((entity.doc_id, "employer")))
                else []
            ),
        ]
    text = [
        f"The {entity.name} was a {s['category']} that took place in "
        f"{link('location').name} in {s['year']}."
    ]
    if "organiser" in entity.links:
        text.append(f"It was organised by {link('organiser').phrase}.")
    if "leader" in entity.links:
        text.append(f"It was led by {link('leader').name}.")
    return text


def render_pages(world: World) -> list[Document]:
    """Renders every entity as a page, ordered by page id.

    Args:
        world: The world from `build_world`.

    Returns:
        The documents; each text starts with an infobox, then a blank line and prose.

    Example:
        >>> from environments.search.world import build_world
        >>> pages = render_pages(build_world(200, seed=1))
        >>> pages[0].text.splitlines()[0].startswith("Type: ")
        True
    """
    mentioned = _mentions(world)
    documents = []
    for doc_id in sorted(world.entities):
        entity = world.entities[doc_id]
        rng = random.Random(f"page-{world.seed}-{doc_id}")
        text = (
            "\n".join(_infobox(world, entity))
            + "\n\n"
            + " ".join(_prose(world, entity, rng, mentioned))
        )
        documents.append(Document(id=doc_id, title=entity.name, text=text))
    return documents
