"""SpriteWorld's memory world: film facts no instruction states, instructions that leave out what history fixes, and
(character, action) / (character, friend) pairs held out of the training films.

Switched on by ``SpriteWorldConfig.memory`` / ``held_out_pairs``; with both off the world is the one of
:mod:`animegamer.spriteworld.films`, bit for bit (every draw below uses its own random stream, seeded by the
dataset seed and the film's index). ``SpriteWorldConfig.back`` adds the word ``back`` and the one change to a
film's plan: short trips out and back are likelier (``COME_BACK``), so ``back`` is said often enough to learn.

**Facts a film keeps** (drawn, never said; :mod:`animegamer.spriteworld.home`):

- its home: wall and floor colours and a mirrored or designed furniture layout of the bedroom and kitchen;
- a companion: after a social shot the friend follows the hero for the next ``FOLLOW_SHOTS`` shots (not while the
  hero sleeps), standing at the right edge.

**What instructions leave out** (memory films, every turn after the first; the grammar of
:func:`animegamer.states.parse_instruction` is kept: the background is always two words, ``<time> <place>``):

- ``still`` for the time of day when it has not changed, ``later`` when it moved on to the next one;
- ``here`` for the place when the hero stays, ``back`` (with ``back`` on) for the place the hero was before the
  current one (a short trip out and back: such films make them likelier, ``COME_BACK``), ``home`` for the bedroom
  once the film has been there;
- ``friend`` for the companion's name in ``talk with`` / ``play ball with`` once the film has shown them.

A memory clip's tag line says what its instruction says (``<EV>later here</EV>``), as the player typed it; the
record's ``extra`` keeps the full spec, the home and the companion, so the clip can be drawn again. The decoder
side (base model, stage (a)) reads the clip's caption instead (:func:`caption_text`): every word, the home's look
and the companion.

**Marks** (written to every game turn's ground truth, read by :mod:`animegamer.eval.intervals`):

- ``depends``: ``history`` when the instruction leaves something out, or an earlier turn showed the home drawn
  now, or the companion stands in the shot; ``new`` when the shot shows the home for the first time (nothing
  earlier tells its colours); ``full`` otherwise (the instruction names everything drawn);
- ``held_out_pair``: the shot pairs its hero with a held-out action, or with a held-out friend in view;
- ``reach``: how many turns back the latest turn showing what the instruction leaves unsaid is (``still`` /
  ``later`` / ``here``: 1; ``back``: the latest turn at that place, 2 or more; the friend: its latest turn in view).
  Only a history of at least ``reach`` turns shows it; the evaluation's ``far`` split holds the turns with reach
  >= 2. The home does not count: no instruction ever says it, so a game played from instructions alone only has
  its own first guess of it (keeping that guess is consistency, not something a real clip can score).

Held-out pairs (``"Momo:fly"``: Momo never flies in a training film; ``"Qiqi:Luna"``: they never meet, either
way round) are removed from the training films' action choices and friends; in held-out films the held-out
actions of their hero are made likelier and a held-out friend is the film's friend, so the held-out games have them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from animegamer.data.manifest import ClipRecord
from animegamer.spriteworld.home import FLOOR_NAMES, FLOORS, INDOORS, WALL_NAMES, WALLS, HomeLook
from animegamer.spriteworld.world import (
    ACTIONS,
    ADVERB_SPEED,
    CHARACTERS,
    PLACES,
    TIMES,
    caption_tags,
    spec_from_instruction,
)
from animegamer.states import Instruction, ShotTags, StateValues, TagError

STILL, LATER, HERE, BACK, HOME, FRIEND = "still", "later", "here", "back", "home", "friend"
MEMORY_WORDS = (STILL, LATER, HERE, BACK, HOME, FRIEND)
HOME_PLACE = "bedroom"  # where "home" takes the hero
FOLLOW_SHOTS = 2  # shots the friend follows after a social shot
# how often a memory instruction leaves each out
OMIT_TIME, OMIT_PLACE, OMIT_FRIEND, SAY_BACK, SAY_HOME = 0.5, 0.5, 0.6, 0.8, 0.7
COME_BACK = 0.5  # with back: the chance a film's next shot returns to the place left one or two shots before
BOOST = 2.0  # weight added to a held-out film's held-out actions in every succession
# the words a captioner adds for what a memory clip shows beyond its tags (caption_text)
CAPTION_WORDS = ("Home", "walls", "floor", "layout", "mirrored", "designed", "Companion", *WALL_NAMES, *FLOOR_NAMES)


def lexicon(back: bool = False) -> list[str]:
    """Every word a SpriteWorld instruction can contain (names, adverbs, actions, times, places), for the tiny
    tokenizers' corpora. The memory world's ``still later here home friend`` are among them (and ``back`` when the
    world says it: ``SpriteWorldConfig.back``; without it the corpus, so the tokenizers, are those of the world
    before ``back`` existed), and the words its captions add (home colours, the companion)."""
    words = [*CHARACTERS, *ADVERB_SPEED, *TIMES, *PLACES]
    for action in ACTIONS.values():
        words += [w for w in action.text.split() if w != "{friend}"]
    memory = [w for w in MEMORY_WORDS if back or w != BACK]
    return list(dict.fromkeys([*words, *memory, *CAPTION_WORDS]))  # memory words stand where these stand


def caption_text(record: ClipRecord) -> str:
    """The text the decoder side reads for a clip (the base model's caption, stage (a)'s text tokens): what a
    captioner watching it writes. Every word said (:func:`~animegamer.spriteworld.world.caption_tags`), and in a
    memory film also what no instruction says but the clip shows: the home's look and the companion, e.g.
    ``Character: Kai; Motion: calmly eat; Background: noon kitchen. Home: mint walls, carpet floor, mirrored
    layout. Companion: Luna.`` A text-to-video model told the colours draws them; one never told learns their
    average (grey walls) and an extra figure that may or may not be there. Only the MLLM reads the instruction as
    typed, so a GC-style decoder driven by the instruction cannot know them; earlier shots show them."""
    tags = caption_tags(record)
    if tags is None:
        raise ValueError(f"{record.clip_id}: no tags, nothing to caption")
    extra = record.extra or {}
    parts = [tags.motion_text()]
    home = HomeLook.from_value(extra.get("home"))
    if home is not None:
        parts.append(home.describe())
    if extra.get("companion"):
        parts.append(f"Companion: {extra['companion']}.")
    return " ".join(parts)


@dataclass(frozen=True)
class HeldOutPairs:
    """(character, action) and unordered (character, character) pairs no training film has."""

    actions: frozenset[tuple[str, str]] = frozenset()
    friends: frozenset[frozenset[str]] = frozenset()

    @classmethod
    def parse(cls, items: Sequence[str]) -> HeldOutPairs:
        """``["Momo:fly", "Qiqi:Luna"]`` -> the pairs; anything outside the world raises ValueError."""
        actions, friends = set(), set()
        for item in items:
            who, _, what = str(item).partition(":")
            if who not in CHARACTERS or not (what in ACTIONS or (what in CHARACTERS and what != who)):
                raise ValueError(f"held_out_pairs: {item!r} is not 'Character:action' or 'Character:Character' "
                                 f"(characters {list(CHARACTERS)}, actions {list(ACTIONS)})")
            (actions.add((who, what)) if what in ACTIONS else friends.add(frozenset((who, what))))
        return cls(frozenset(actions), frozenset(friends))

    def banned_actions(self, hero: str) -> tuple[str, ...]:
        return tuple(sorted(a for c, a in self.actions if c == hero))

    def banned_friends(self, hero: str) -> tuple[str, ...]:
        return tuple(sorted(c for pair in self.friends if hero in pair for c in pair if c != hero))

    def pairs(self, hero: str, action: str, friend_in_view: str) -> bool:
        """Does a shot of ``hero`` doing ``action`` with ``friend_in_view`` ("" none) show a held-out pair?"""
        return (hero, action) in self.actions or frozenset((hero, friend_in_view)) in self.friends


def allowed_weights(weights: dict[str, float], banned: Sequence[str], boosted: Sequence[str]) -> dict[str, float]:
    """Succession weights without ``banned`` actions and with ``boosted`` ones made likelier (order kept, so with
    neither the dict is the same and so are the draws)."""
    if not banned and not boosted:
        return weights
    out = {a: w for a, w in weights.items() if a not in banned}
    for action in boosted:
        out[action] = out.get(action, 0.0) + BOOST
    return out or {"walk": 1.0}


@dataclass(frozen=True)
class ShotMemory:
    """What a memory film adds to one shot: the instruction's words, the drawn facts, the turn's marks."""

    time_word: str  # a time of day, STILL or LATER
    place_word: str  # a place, HERE, BACK or HOME
    friend_word: str  # the friend's name or FRIEND (social actions), "" otherwise
    home: HomeLook | None  # the film's home, set when the shot is indoors
    companion: str  # the friend following the hero, drawn beside; "" none
    depends: str  # full | history | new
    held_out_pair: bool
    reach: int = 0  # how many turns back the latest turn showing what this one leaves unsaid is (0: nothing)

    def tags(self, spec, motion_level: int) -> ShotTags:
        """The shot's tag line as its instruction says it (what history fixes left out), values by the rules."""
        a = ACTIONS[spec.action]
        values = StateValues(motion_level=int(motion_level), social=a.social, entertainment=a.entertainment,
                             stamina=a.stamina)
        return ShotTags(spec.character, a.text.format(friend=self.friend_word), f"{self.time_word} {self.place_word}",
                        spec.adverb, values)

    def extra(self) -> dict:
        """The record / game-row fields: drawing settings (home, companion) and marks."""
        return {"home": self.home.to_list() if self.home else None, "companion": self.companion,
                "depends": self.depends, "held_out_pair": self.held_out_pair, "reach": self.reach}


def follows(shots: Sequence, friend: str | None = None) -> list[str]:
    """The companion of each shot: after a social shot the friend follows the hero for the next
    :data:`FOLLOW_SHOTS` shots that are not social, and a sleep ends it ("" no companion). ``friend``: the film's
    friend; None: the friend of the latest social shot (a game's)."""
    out, follow, latest = [], 0, ""
    for spec in shots:
        social = bool(spec.friend)
        latest = spec.friend or latest
        out.append((latest if friend is None else friend) if not social and follow > 0 and spec.action != "sleep"
                   else "")
        follow = FOLLOW_SHOTS if social else (0 if spec.action == "sleep" else max(0, follow - 1))
    return out


def film_memory(rng: np.random.Generator, shots: Sequence, friend: str, held_out: HeldOutPairs,
                memory: bool = True, back: bool = True) -> list[ShotMemory]:
    """The memory of one film's shots (module doc). With ``memory`` off every word is said, nothing extra is
    drawn and only the held-out marks are set (every turn ``full``); with ``back`` off ``back`` is never said
    (the same draws, so the other words are those of the world before ``back`` existed)."""
    look = HomeLook(int(rng.integers(len(WALLS))), int(rng.integers(len(FLOORS))), bool(rng.random() < 0.5))
    out: list[ShotMemory] = []
    followers = follows(shots, friend) if memory else [""] * len(shots)
    places = []
    last_friend: int | None = None  # the latest turn with the friend in view
    last_indoors: int | None = None  # the latest turn that showed the home
    last_at: dict[str, int] = {}  # the latest turn at each place
    previous = ""  # the place before the current stretch of turns at one place
    for t, spec in enumerate(shots):
        social, companion = bool(spec.friend), followers[t]
        time_word, place_word, friend_word = spec.time, spec.place, spec.friend
        if memory and t > 0:
            prev = shots[t - 1]
            draw_time, draw_place, draw_friend = rng.random(3)  # always three draws: one stream per film
            if spec.time == prev.time and draw_time < OMIT_TIME:
                time_word = STILL
            elif TIMES.index(spec.time) == TIMES.index(prev.time) + 1 and draw_time < OMIT_TIME:
                time_word = LATER
            if spec.place == prev.place and draw_place < OMIT_PLACE:
                place_word = HERE
            elif back and spec.place == previous and draw_place < SAY_BACK:
                place_word = BACK
            elif spec.place == HOME_PLACE and HOME_PLACE in places and draw_place < SAY_HOME:
                place_word = HOME
            if social and last_friend is not None and draw_friend < OMIT_FRIEND:
                friend_word = FRIEND
        indoors = memory and spec.place in INDOORS
        omitted = {time_word, place_word, friend_word} & set(MEMORY_WORDS)
        home_seen = indoors and last_indoors is not None
        if omitted or companion or home_seen:
            depends = "history"
        elif indoors:
            depends = "new"
        else:
            depends = "full"
        # where the unsaid is last shown: the turn before (time, here), the latest turn at the place (back) or with
        # the friend in view (the home is never said: module doc)
        needs = [1] if {time_word, place_word} & {STILL, LATER, HERE} else []
        if place_word == BACK:
            needs.append(t - last_at[spec.place])
        if friend_word == FRIEND or companion:
            needs.append(t - last_friend)
        in_view = spec.friend or companion
        out.append(ShotMemory(time_word, place_word, friend_word, look if indoors else None, companion, depends,
                              held_out.pairs(spec.character, spec.action, in_view), max(needs, default=0)))
        last_friend = t if in_view else last_friend
        last_indoors = t if indoors else last_indoors
        if t > 0 and spec.place != shots[t - 1].place:
            previous = shots[t - 1].place
        last_at[spec.place] = t
        places.append(spec.place)
    return out


@dataclass
class GameMemory:
    """What a player's earlier turns fixed, to resolve a memory instruction into the shot it asks for."""

    time: str = ""
    place: str = ""
    friend: str = ""
    previous: str = ""  # the place before the current one
    places: list[str] = field(default_factory=list)

    def resolve(self, instruction: Instruction, *, source: str = "", line: int | None = None):
        """The :class:`~animegamer.spriteworld.world.ShotSpec` of ``instruction`` given the earlier turns (and
        remember it); a word that refers to nothing yet (``here`` on the first turn) raises TagError."""
        if not instruction.structured:
            raise TagError("free text is not a SpriteWorld instruction", source=source, line=line, field="format")
        time_word, _, place_word = instruction.background.partition(" ")
        time = {STILL: self.time, LATER: TIMES[min(len(TIMES) - 1, TIMES.index(self.time) + 1)]
                if self.time else ""}.get(time_word, time_word)
        home = HOME_PLACE if HOME_PLACE in self.places else ""
        place = {HERE: self.place, BACK: self.previous, HOME: home}.get(place_word, place_word)
        motion = instruction.motion
        if motion.endswith(f" with {FRIEND}"):
            motion = motion[: -len(FRIEND)] + self.friend if self.friend else motion
        for word, value in ((time_word, time), (place_word, place)):
            if not value:
                raise TagError(f"{word!r} refers to an earlier turn, and there is none that says it",
                               source=source, line=line, field="background")
        spec = spec_from_instruction(Instruction(instruction.character, motion, f"{time} {place}"), source=source,
                                     line=line)
        if self.place and spec.place != self.place:
            self.previous = self.place
        self.time, self.place = spec.time, spec.place
        self.friend = spec.friend or self.friend
        self.places.append(spec.place)
        return spec


def resolve_game(instructions: Sequence[Instruction], source: str = "") -> list:
    """The ShotSpec of every turn of a game whose instructions may leave out what earlier turns fixed."""
    memory = GameMemory()
    return [memory.resolve(instruction, source=source, line=i + 1) for i, instruction in enumerate(instructions)]
