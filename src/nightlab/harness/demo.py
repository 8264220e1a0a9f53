"""The `demo` dataset: an offline corpus of short stories, generated deterministically.

It lets a lab run with no network at all (the `cpu` profile's dataset) and still has
something to learn at every level a small model can see:

- words: Zipf-distributed vocabularies, regular and irregular plurals and past tenses,
  `a`/`an` before vowels, number words that agree with their nouns;
- sentences: a few dozen grammatical templates (narration, dialogue, counting, questions);
- documents: a topic fixes the places, things and jobs a story draws from; two or three
  named characters are introduced once and recur with the right pronoun; the title and the
  closing sentence return to the object of the first paragraph.

Bytes are identical on every machine and Python version: the only randomness is PCG32
written out below (integer arithmetic only; `random`'s algorithms are not a stable
contract), choices use integer weights, and no set or hash order is involved. The corpus
is ~5 MB, made in about a second; `tests/harness/test_data_demo.py` pins its sha256.
Changing anything here changes the data: bump `profiles.SOURCE_VERSIONS["demo"]` with it.

The validation stories are the one exception (`demo_validation`): drawn the same way, but from
a PCG32 seeded with a secret `prepare` makes (`os.urandom`) and keeps in the data folder, which
the sandbox hides. This package's code alone can regenerate every training story, and none of
the validation ones, so a `train.py` cannot train on the text it is scored on. Each data folder
has its own validation stories; a lab's workers receive the controller's secret at set-up
(`fleet.sky_task`), so all of a lab's machines score on the same rows.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

__all__ = ["DEMO_DOCS", "DEMO_VAL_EVERY", "demo_documents", "demo_validation"]

DEMO_DOCS = 6000  # ~5 MB of text: ~1.2 M tokens at the cpu profile's vocab of 1024
# document i % 10 == 9 of the generated stream is left out of training and a secret story takes its
# place in validation: 10% of the corpus (the left-out ones were validation before issue 30)
DEMO_VAL_EVERY = 10
DEMO_SEED = 20260301

_MASK64 = (1 << 64) - 1


class _Pcg32:
    """PCG32 (O'Neill 2014, pcg32_random_r): a 64-bit LCG with a permuted 32-bit output."""

    def __init__(self, seed: int, stream: int = 54):
        self.inc = ((stream << 1) | 1) & _MASK64
        self.state = 0
        self.next()
        self.state = (self.state + seed) & _MASK64
        self.next()

    def next(self) -> int:
        old = self.state
        self.state = (old * 6364136223846793005 + self.inc) & _MASK64
        xorshifted = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
        rot = old >> 59
        return ((xorshifted >> rot) | (xorshifted << ((-rot) & 31))) & 0xFFFFFFFF

    def below(self, n: int) -> int:
        """Uniform-enough integer in [0, n) (Lemire's multiply-shift, bias < n / 2**32)."""
        return (self.next() * n) >> 32

    def pick(self, seq: Sequence):
        return seq[self.below(len(seq))]


class _Zipf:
    """Words drawn with weight ~ 1 / rank, so a few are common and most are rare."""

    def __init__(self, words: Sequence):
        self.words = tuple(words)
        total, cum = 0, []
        for rank in range(len(self.words)):
            total += 100_000 // (rank + 1)
            cum.append(total)
        self.cum = cum

    def draw(self, rng: _Pcg32):
        return self.words[bisect_right(self.cum, rng.below(self.cum[-1]))]


# ---------------------------------------------------------------------------
# Vocabulary. Topic -> (places, things, jobs, adjectives that suit them).

_TOPICS: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "sea": (
        ("harbor", "beach", "island", "lighthouse", "boat", "bay"),
        ("shell", "fish", "net", "wave", "anchor", "sail", "rope", "crab", "map", "pearl", "gull", "oar"),
        ("sailor", "fisher", "captain", "diver"),
        ("salty", "blue", "wet", "windy", "deep"),
    ),
    "forest": (
        ("forest", "cabin", "river", "meadow", "cave", "hill"),
        (
            "tree",
            "leaf",
            "fox",
            "owl",
            "berry",
            "stick",
            "mushroom",
            "deer",
            "mouse",
            "nest",
            "acorn",
            "wolf",
        ),
        ("ranger", "hunter", "woodcutter", "painter"),
        ("green", "quiet", "dark", "tall", "wild"),
    ),
    "city": (
        ("station", "street", "library", "tower", "park", "bridge"),
        (
            "bus",
            "train",
            "lamp",
            "book",
            "coin",
            "ticket",
            "window",
            "bench",
            "clock",
            "letter",
            "box",
            "key",
        ),
        ("driver", "clerk", "teacher", "doctor"),
        ("busy", "loud", "bright", "old", "grey"),
    ),
    "farm": (
        ("farm", "barn", "field", "orchard", "garden", "mill"),
        ("cow", "sheep", "goat", "apple", "egg", "hen", "pig", "horse", "carrot", "bucket", "fence", "seed"),
        ("farmer", "baker", "miller", "shepherd"),
        ("sunny", "muddy", "warm", "golden", "fresh"),
    ),
    "space": (
        ("ship", "station", "moon", "planet", "crater", "base"),
        (
            "star",
            "rocket",
            "robot",
            "helmet",
            "comet",
            "rock",
            "signal",
            "engine",
            "screen",
            "suit",
            "map",
            "beam",
        ),
        ("pilot", "engineer", "scientist", "explorer"),
        ("silver", "cold", "strange", "distant", "silent"),
    ),
    "kitchen": (
        ("kitchen", "bakery", "market", "cellar", "shop", "cafe"),
        ("cake", "bread", "pot", "spoon", "cup", "pie", "soup", "knife", "bowl", "plate", "lemon", "cookie"),
        ("cook", "baker", "grocer", "waiter"),
        ("sweet", "hot", "tasty", "crisp", "soft"),
    ),
    "school": (
        ("school", "classroom", "hall", "yard", "library", "office"),
        (
            "pencil",
            "book",
            "desk",
            "chalk",
            "ball",
            "bell",
            "paper",
            "bag",
            "drum",
            "globe",
            "ruler",
            "puzzle",
        ),
        ("teacher", "student", "janitor", "coach"),
        ("small", "new", "clever", "noisy", "neat"),
    ),
    "mountain": (
        ("mountain", "valley", "village", "lake", "peak", "pass"),
        (
            "stone",
            "goat",
            "snow",
            "flag",
            "tent",
            "boot",
            "eagle",
            "lantern",
            "sled",
            "cloud",
            "path",
            "cliff",
        ),
        ("climber", "guide", "herder", "miner"),
        ("steep", "icy", "high", "rocky", "white"),
    ),
}

_NAMES = (
    ("Mira", "she"), ("Tom", "he"), ("Lena", "she"), ("Sam", "he"), ("Ada", "she"), ("Ben", "he"),
    ("Nora", "she"), ("Leo", "he"), ("Ivy", "she"), ("Max", "he"), ("Ruby", "she"), ("Finn", "he"),
    ("Zoe", "she"), ("Omar", "he"), ("Ella", "she"), ("Hugo", "he"), ("Lily", "she"), ("Jack", "he"),
    ("Maya", "she"), ("Noah", "he"), ("Anna", "she"), ("Eli", "he"), ("Rosa", "she"), ("Theo", "he"),
    ("Clara", "she"), ("Oscar", "he"), ("Iris", "she"), ("Felix", "he"), ("June", "she"), ("Arlo", "he"),
)  # fmt: skip

_ADJECTIVES = (
    "little", "big", "happy", "red", "kind", "funny", "brave", "shiny", "tiny", "lucky", "sad", "gentle",
    "round", "heavy", "clever", "sleepy", "proud", "curious", "yellow", "lost", "broken", "magic", "huge",
)  # fmt: skip
_FEELINGS = ("happy", "glad", "proud", "tired", "surprised", "calm", "sad", "excited", "scared", "curious")

# (present, past): regular ones follow the -ed rule, the irregular ones must be learned.
_VERBS = (
    ("find", "found"), ("see", "saw"), ("take", "took"), ("make", "made"), ("give", "gave"), ("hold", "held"),
    ("carry", "carried"), ("clean", "cleaned"), ("paint", "painted"), ("open", "opened"), ("fix", "fixed"),
    ("drop", "dropped"), ("hide", "hid"), ("draw", "drew"), ("wash", "washed"), ("throw", "threw"),
    ("lift", "lifted"), ("bring", "brought"), ("pick", "picked"), ("watch", "watched"), ("count", "counted"),
)  # fmt: skip
_MOTION = (("walk", "walked"), ("run", "ran"), ("go", "went"), ("climb", "climbed"), ("hurry", "hurried"))
_ADVERBS = ("slowly", "quickly", "quietly", "carefully", "happily", "suddenly", "softly", "bravely")
_TIMES = ("One morning", "Later that day", "After a while", "The next day", "That evening", "Soon", "At noon")
_NUMBERS = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
)
_IRREGULAR_PLURALS = {"mouse": "mice", "fish": "fish", "sheep": "sheep", "wolf": "wolves", "leaf": "leaves",
                      "knife": "knives", "deer": "deer", "goose": "geese"}  # fmt: skip


def _plural(noun: str) -> str:
    if noun in _IRREGULAR_PLURALS:
        return _IRREGULAR_PLURALS[noun]
    if noun.endswith(("s", "x", "ch", "sh")):
        return noun + "es"
    if noun.endswith("y") and noun[-2] not in "aeiou":
        return noun[:-1] + "ies"
    return noun + "s"


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _count(n: int, noun: str) -> str:
    return f"{_NUMBERS[n]} {noun if n == 1 else _plural(noun)}"


# ---------------------------------------------------------------------------


class _Story:
    """State of one document: its topic, characters and the object it starts and ends with."""

    def __init__(self, rng: _Pcg32, index: int):
        self.rng = rng
        self.index = index
        places, things, jobs, topic_adjs = _TOPICS[rng.pick(tuple(_TOPICS))]
        self.places, self.things, self.jobs = _Zipf(places), _Zipf(things), _Zipf(jobs)
        self.adjs = _Zipf(topic_adjs + _ADJECTIVES)
        first = rng.below(len(_NAMES))
        step = 1 + rng.below(len(_NAMES) - 1)
        n_people = 2 + rng.below(2)
        self.people = [_NAMES[(first + k * step) % len(_NAMES)] for k in range(n_people)]
        self.object = self.things.draw(rng)
        self.object_adj = self.adjs.draw(rng)
        self.home = self.places.draw(rng)
        self.last = self.people[0]  # the character a pronoun refers to: the last one named

    def person(self) -> tuple[str, str]:
        # the hero appears in about half the sentences, the others share the rest
        return self.people[0] if self.rng.below(2) == 0 else self.rng.pick(self.people)

    def sentence(self) -> str:
        rng, kind = self.rng, self.rng.below(10)
        name, _ = self.person()
        thing, place, adj = self.things.draw(rng), self.places.draw(rng), self.adjs.draw(rng)
        verb = rng.pick(_VERBS)
        if kind == 0:
            return f"{rng.pick(_TIMES)}, {name} {rng.pick(_MOTION)[1]} to the {place}."
        if kind == 1:
            other = rng.pick([p for p in self.people if p[0] != name])[0]
            return f"{name} {verb[1]} {_a(adj)} {thing} and gave it to {other}."
        if kind == 2:
            n = 2 + rng.below(11)
            return f"There were {_count(n, thing)} in the {place}, and {name} counted them: " + (
                ", ".join(_NUMBERS[1 : n + 1]) + "."
            )
        if kind == 3:
            return f'"I want to {verb[0]} the {thing}," said {name}.'
        if kind == 4:
            return f"{self.last[1].capitalize()} {verb[1]} the {thing} {rng.pick(_ADVERBS)}."
        if kind == 5:
            return f"The {thing} was {adj}, so {name} felt {rng.pick(_FEELINGS)}."
        if kind == 6:
            pron = dict(self.people)[name]
            return f"Why did {name} {verb[0]} the {thing}? Because {pron} needed it for the {place}."
        if kind == 7:
            return f"{name} looked for the {self.object_adj} {self.object} near the {place}."
        if kind == 8:
            return (
                f"{_a(adj).capitalize()} {self.jobs.draw(rng)} {verb[1]} {_count(1 + rng.below(4), thing)}."
            )
        other = rng.pick([p for p in self.people if p[0] != name])[0]
        return f"{name} and {other} {rng.pick(_MOTION)[1]} {rng.pick(_ADVERBS)} past the {place}."

    def _narrate(self) -> str:
        text = self.sentence()
        for person in self.people:  # the first-named character in the sentence becomes "the last named"
            if text.find(person[0]) >= 0 and (
                text.find(self.last[0]) < 0 or text.find(person[0]) <= text.find(self.last[0])
            ):
                self.last = person
        return text

    def text(self) -> str:
        rng = self.rng
        hero, pron = self.people[0]
        job = self.jobs.draw(rng)
        lines = [f"Story {self.index}: The {self.object_adj.capitalize()} {self.object.capitalize()}", ""]
        friends = " and ".join(name for name, _ in self.people[1:])
        lines.append(
            f"{hero} was {_a(rng.pick(_ADJECTIVES))} {job} who lived near the {self.home}. "
            f"{pron.capitalize()} had {_a(self.object_adj)} {self.object}. "
            f"{pron.capitalize()} often played with {friends}."
        )
        for _ in range(2 + rng.below(3)):
            lines.append("")
            lines.append(" ".join(self._narrate() for _ in range(3 + rng.below(4))))
        lines.append("")
        lines.append(
            f"In the end, {hero} found the {self.object_adj} {self.object} again and was "
            f"{rng.pick(_FEELINGS[:6])}. The end."
        )
        return "\n".join(lines) + "\n"


def demo_documents() -> list[str]:
    """The whole demo corpus, in order: `DEMO_DOCS` stories, identical bytes everywhere."""
    rng = _Pcg32(DEMO_SEED)
    return [_Story(rng, i).text() for i in range(DEMO_DOCS)]


def demo_validation(secret: bytes) -> list[str]:
    """The validation stories: `DEMO_DOCS // DEMO_VAL_EVERY` of them, drawn from `secret` (16+ bytes).

    Numbered like the left-out stories they replace (9, 19, ...); 127 bits of the secret seed the
    generator (64 for its state, 63 for its stream), far beyond guessing.
    """
    if len(secret) < 16:
        raise ValueError(f"the validation secret needs 16 bytes or more, got {len(secret)}")
    rng = _Pcg32(int.from_bytes(secret[:8], "big"), int.from_bytes(secret[8:16], "big"))
    return [_Story(rng, i).text() for i in range(DEMO_VAL_EVERY - 1, DEMO_DOCS, DEMO_VAL_EVERY)]
