"""Random text prompts of about N tokens (one short common word is about one token)."""

from __future__ import annotations

import random

_TEXT = (
    "the of and to in is was for on as with by at from that this it be are or an have not "
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "river stone light paper music water garden window market story color number city house"
)
WORDS = _TEXT.split()


def prompt(rng: random.Random, n_words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(max(1, n_words)))
