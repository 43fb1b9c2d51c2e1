"""Go rules as data: ko, suicide and scoring variants, komi, presets, fixed handicap placement.

A game's rules are one int32 row (`Rules.as_row()`) that the kernels read, so one batch can hold
games under different rules and no kernel has a code path per rule set.
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np

# Columns of a rules row.
RULE_KO = 0
RULE_SUICIDE = 1
RULE_SCORING = 2
RULE_KOMI_HALVES = 3  # komi * 2, so any multiple of 0.5 is exact
RULE_FIELDS = 4

KO_SIMPLE = 0
KO_POSITIONAL = 1
KO_SITUATIONAL = 2

SCORING_AREA = 0
SCORING_TERRITORY = 1

KO_NAMES = {"simple": KO_SIMPLE, "positional": KO_POSITIONAL, "situational": KO_SITUATIONAL}
SCORING_NAMES = {"area": SCORING_AREA, "territory": SCORING_TERRITORY}


class RulesError(ValueError):
    """A rules name, shorthand or field that tengen does not know."""


@dataclasses.dataclass(frozen=True)
class Rules:
    """One game's rules.

    `suicide` allows multi-stone suicide; a single stone with no liberties is never legal (as in
    KataGo: it would leave the position unchanged).
    """

    ko: str = "positional"
    suicide: bool = True
    scoring: str = "area"
    komi: float = 7.5

    def __post_init__(self) -> None:
        if self.ko not in KO_NAMES:
            raise RulesError(f"ko rule must be one of {sorted(KO_NAMES)} (got {self.ko!r})")
        if self.scoring not in SCORING_NAMES:
            raise RulesError(
                f"scoring must be one of {sorted(SCORING_NAMES)} (got {self.scoring!r})"
            )
        if not float(self.komi * 2).is_integer() or abs(self.komi) > 1000:
            raise RulesError(f"komi must be a multiple of 0.5 within +-1000 (got {self.komi!r})")

    def as_row(self) -> np.ndarray:
        row = np.zeros(RULE_FIELDS, dtype=np.int32)
        row[RULE_KO] = KO_NAMES[self.ko]
        row[RULE_SUICIDE] = int(self.suicide)
        row[RULE_SCORING] = SCORING_NAMES[self.scoring]
        row[RULE_KOMI_HALVES] = round(self.komi * 2)
        return row

    def with_komi(self, komi: float) -> Rules:
        return dataclasses.replace(self, komi=float(komi))

    @property
    def name(self) -> str:
        """The preset name these rules match (komi aside), else KataGo's shorthand."""
        for preset, rules in PRESETS.items():
            if dataclasses.replace(rules, komi=self.komi) == self:
                return preset
        return self.shorthand()

    def shorthand(self) -> str:
        """KataGo's rules shorthand, e.g. `koPOSITIONALscoreAREAsui1`."""
        return f"ko{self.ko.upper()}score{self.scoring.upper()}sui{int(self.suicide)}"

    def to_json(self) -> str:
        return json.dumps(
            {
                "ko": self.ko.upper(),
                "scoring": self.scoring.upper(),
                "suicide": self.suicide,
                "komi": self.komi,
            }
        )


PRESETS: dict[str, Rules] = {
    "tromp-taylor": Rules(ko="positional", suicide=True, scoring="area", komi=7.5),
    "chinese": Rules(ko="simple", suicide=False, scoring="area", komi=7.5),
    "japanese": Rules(ko="simple", suicide=False, scoring="territory", komi=6.5),
    "new-zealand": Rules(ko="situational", suicide=True, scoring="area", komi=7.5),
    "aga": Rules(ko="situational", suicide=False, scoring="area", komi=7.5),
    # What GNU Go plays: simple ko, no suicide, area scoring.
    "simple": Rules(ko="simple", suicide=False, scoring="area", komi=7.5),
}

ALIASES = {
    "tt": "tromp-taylor",
    "trompt-taylor": "tromp-taylor",
    "tromptaylor": "tromp-taylor",
    "cn": "chinese",
    "korean": "japanese",
    "jp": "japanese",
    "nz": "new-zealand",
    "newzealand": "new-zealand",
    "new zealand": "new-zealand",
}

_SHORTHAND = re.compile(
    r"^ko(?P<ko>SIMPLE|POSITIONAL|SITUATIONAL)score(?P<scoring>AREA|TERRITORY)"
    r"(?:tax(?:NONE|SEKI|ALL))?sui(?P<suicide>[01])(?:.*)$"
)


def parse_rules(text: str, *, komi: float | None = None) -> Rules:
    """Rules from a preset name, KataGo's shorthand (`koSIMPLEscoreAREAsui0`) or KataGo's JSON.

    The preset's komi applies unless `komi` is given.
    """
    raw = text.strip()
    key = ALIASES.get(raw.lower(), raw.lower())
    if key in PRESETS:
        rules = PRESETS[key]
    elif (m := _SHORTHAND.match(raw)) is not None:
        rules = Rules(ko=m["ko"].lower(), scoring=m["scoring"].lower(), suicide=m["suicide"] == "1")
    elif raw.startswith("{"):
        try:
            fields = json.loads(raw)
        except json.JSONDecodeError as e:
            raise RulesError(f"rules JSON is malformed: {e}") from None
        if not isinstance(fields, dict):
            raise RulesError("rules JSON must be an object")
        known = {
            "ko",
            "koRule",
            "scoring",
            "scoringRule",
            "suicide",
            "multiStoneSuicideLegal",
            "komi",
        }
        unknown = sorted(set(fields) - known)
        if unknown:
            raise RulesError(f"rules JSON has unknown keys {unknown}")
        base = PRESETS["tromp-taylor"]
        rules = Rules(
            ko=str(fields.get("ko", fields.get("koRule", base.ko))).lower(),
            scoring=str(fields.get("scoring", fields.get("scoringRule", base.scoring))).lower(),
            suicide=bool(fields.get("suicide", fields.get("multiStoneSuicideLegal", base.suicide))),
            komi=float(fields.get("komi", base.komi)),
        )
    else:
        raise RulesError(
            f"unknown rules {text!r}: use a preset ({', '.join(PRESETS)}), "
            "KataGo's shorthand (koSIMPLEscoreAREAsui0) or a JSON object"
        )
    return rules if komi is None else rules.with_komi(komi)


def rules_from_sgf(ru: str | None, *, komi: float) -> Rules:
    """Rules for an SGF RU[] value; unknown or missing names get Chinese rules (simple ko, no
    suicide), under which real game records replay."""
    if ru:
        try:
            return parse_rules(ru, komi=komi)
        except RulesError:
            pass
    return PRESETS["chinese"].with_komi(komi)


def max_fixed_handicap(size: int) -> int:
    """The most stones GTP's fixed_handicap places on a board of this width."""
    if size % 2 == 1 and size >= 9:
        return 9
    if size >= 7:
        return 4
    return 0


def fixed_handicap_points(size: int, stones: int) -> list[tuple[int, int]]:
    """Fixed handicap placement of the GTP specification, as (x, y) with y = 0 the top row.

    Order: the two opposite corners, the third and fourth corners, then (for 5 and 7) the
    centre, the side points, and the centre last for 9.
    """
    limit = max_fixed_handicap(size)
    if stones < 2 or stones > limit:
        raise RulesError(
            f"fixed handicap of {stones} stones is not defined on {size}x{size} (2..{limit} stones)"
            if limit
            else f"no fixed handicap on {size}x{size} (needs >= 7x7)"
        )
    edge = 3 if size > 11 else 2
    low, high, mid = edge, size - 1 - edge, size // 2
    # (x, y) with y = 0 at the top: lower-left is (low, high), upper-right is (high, low).
    lower_left, upper_right = (low, high), (high, low)
    upper_left, lower_right = (low, low), (high, high)
    left, right = (low, mid), (high, mid)
    top, bottom = (mid, low), (mid, high)
    centre = (mid, mid)
    corners = [lower_left, upper_right, upper_left, lower_right]
    layouts = {
        2: corners[:2],
        3: corners[:3],
        4: corners,
        5: corners + [centre],
        6: corners + [left, right],
        7: corners + [left, right, centre],
        8: corners + [left, right, top, bottom],
        9: corners + [left, right, top, bottom, centre],
    }
    return layouts[stones]
