"""The threat model (`[threat]`): which passive parties attack, what they know, what they do."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import (
    Field,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    model_validator,
)

from splitleak.settings import MAX_ROWS, Settings, StrictFloat, StrictPositiveInt

# The largest float32, what a feature may hold: a trigger_value of 1e300 passed, then stopped
# the party with torch's "value cannot be converted to type float without overflow".
FLOAT32_MAX = 3.4028234663852886e38

DEFAULT_HINTS = (1, 3, 5)
# The attack scoring each integrity variant (splitleak.integrity.VARIANTS).
INTEGRITY_ATTACKS = {"backdoor": "replacement_backdoor", "noisy": "noisy_samples",
                     "missing": "missing_features"}


class ReplacementBackdoor(Settings):
    """Label replacement backdoor (VFLAIR's LRB, ALGORITHMS.md §2.16): in every train batch the
    party sends, for each target-class row it knows, the activation of a triggered row instead,
    and backpropagates that row's gradient into the triggered row too; at inference it triggers
    its features to have rows classified as the target."""

    target_class: NonNegativeInt = 0  # the class triggered rows are to be given
    known_targets: PositiveInt = 10  # target-class train rows it knows (VFLAIR: the class count)
    poison_fraction: float = Field(0.01, gt=0, lt=1)  # train rows it triggers, and test rows
    # scored under the trigger (VFLAIR: 1 % of each)
    trigger_value: float | None = Field(  # the trigger's value; None: its train features' maximum
        None, ge=-3.4028234663852886e38, le=FLOAT32_MAX)


class NoisySamples(Settings):
    """Noisy-sample attack at inference (VFLAIR's NSB): the party adds N(0, (λ·range)²) noise to
    its features of a fraction of the test rows, clipped to their range."""

    noise_lambda: PositiveFloat = 2.0  # λ, in units of the features' range (VFLAIR's images: [0, 1])
    noise_rate: float = Field(0.01, gt=0, lt=1)  # test rows it sends noisy (VFLAIR: 1 %)


class MissingFeatures(Settings):
    """Missing features (VFLAIR's MF): the party's output is zero for a fraction of the rows."""

    missing_rate: float = Field(0.25, gt=0, lt=1)  # rows of each batch, and of the test rows
    during_training: bool = True  # VFLAIR zeroes the rows of every train batch too


class ThreatParty(Settings):
    """One adversarial passive party: its tap, its deviation from the protocol, its side knowledge."""

    curious: bool = True  # its received gradients are tapped to the attacker sidecar
    optimizer: Literal["honest", "malicious"] = "honest"  # malicious: Fu et al.'s optimizer
    gamma: PositiveFloat = 1.0  # malicious optimizer: r = clamp(1 + gamma * g_t / g_(t-1), clamp)
    clamp: tuple[StrictFloat, StrictFloat] = (1.0, 5.0)
    hints: list[StrictPositiveInt] = list(DEFAULT_HINTS)  # k known positives per batch (hint attacks)
    # labelled train rows per class: model completion (whose own parameter has the same bound)
    labelled_per_class: int | None = Field(None, gt=0, le=MAX_ROWS)
    seed: int | None = Field(None, ge=0, lt=2**63)  # draws of side knowledge; None: the run seed
    # Knows the label party's model at each snapshot step (Qiu et al.'s EXACT); [threat.white_box].
    white_box: bool = False
    # Integrity attacks it runs (VFLAIR's targeted and non-targeted families; absent: none).
    backdoor: ReplacementBackdoor | None = None
    noisy_samples: NoisySamples | None = None
    missing_features: MissingFeatures | None = None

    @model_validator(mode="after")
    def _clamp(self) -> ThreatParty:
        low, high = self.clamp
        if not 0 < low <= high:
            raise ValueError(f"clamp = {list(self.clamp)} must be [low, high] with 0 < low <= high "
                             "(Fu et al.: [1.0, 5.0])")
        if self.white_box and not self.curious:
            raise ValueError("white_box = true needs curious = true: EXACT reads the gradients "
                             "the sidecar records for this party")
        return self

    def describe(self) -> str:
        """A few words for reports, e.g. `curious, malicious optimizer (γ=1, clamp [1, 5])`."""
        words = ["curious" if self.curious else "not tapped"]
        if self.optimizer == "malicious":
            low, high = self.clamp
            words.append(f"malicious optimizer (γ={self.gamma:g}, clamp [{low:g}, {high:g}])")
        elif not self.integrity:
            words.append("honest")
        if self.white_box:
            words.append("white-box (label party's model per snapshot step)")
        if self.backdoor is not None:
            b = self.backdoor
            words.append(f"replacement backdoor (target class {b.target_class}, {b.known_targets} "
                         f"known target rows, {_percent(b.poison_fraction)} poisoned)")
        if self.noisy_samples is not None:
            n = self.noisy_samples
            words.append(f"noisy samples at inference (λ={n.noise_lambda:g}, {_percent(n.noise_rate)} "
                         "of the test rows)")
        if self.missing_features is not None:
            m = self.missing_features
            words.append(f"missing features ({_percent(m.missing_rate)} of the rows"
                         f"{', in training too' if m.during_training else ' at inference'})")
        return ", ".join(words)

    @property
    def integrity(self) -> dict[str, Any]:
        """The integrity attacks it runs, by evaluation variant (splitleak.integrity.VARIANTS)."""
        found = {"backdoor": self.backdoor, "noisy": self.noisy_samples,
                 "missing": self.missing_features}
        return {variant: settings for variant, settings in found.items() if settings is not None}


class WhiteBoxConfig(Settings):
    """What a white-box attacker sees and EXACT enumerates (ALGORITHMS.md §2.10)."""

    # Categorical columns of features.label_party that EXACT reconstructs, by schema name; the
    # label party's other columns are assumed known (Qiu et al.). Empty: all its categoricals.
    private_features: list[str] = []
    every: PositiveInt = 1  # snapshot the label party's model every k-th train step (0, k, 2k, ...)
    max_snapshots: PositiveInt = Field(200, le=100_000)  # bounds the artifact: steps < every * this


class ReceiverThreat(Settings):
    """The label party as an attacker on the activations it receives: it reconstructs the
    victims' input features (ALGORITHMS.md §2.11), e.g. to evaluate an input protection."""

    victims: list[StrictPositiveInt] = []  # passive parties whose inputs it reconstructs
    white_box: bool = True  # knows each victim's bottom model: the inversion attack (2.11a)
    back_mapping: bool = True  # trains a decoder on its auxiliary rows (2.11b)
    # Knows the trained model and its own features: a generator of the victim's features (GRN).
    grn: bool = False
    # Knows each victim's bottom and its aggregated parameter gradients per snapshot step (CAFE;
    # the victim writes them, [threat.white_box] every / max_snapshots bound how many).
    cafe: bool = False
    # Train rows whose features (and activations) the attacker owns: the decoder's training
    # set, disjoint from the rows it is scored on.
    auxiliary_fraction: float = Field(0.1, gt=0, lt=1)
    max_rows: PositiveInt = Field(512, le=100_000)  # victim rows scored (drawn from the last epoch)

    @model_validator(mode="after")
    def _ways(self) -> ReceiverThreat:
        if len(set(self.victims)) != len(self.victims):
            raise ValueError(f"receiver.victims = {self.victims} names a party twice")
        if self.victims and not self.attacks:
            raise ValueError("receiver.victims is set but every attack is off: set white_box = "
                             "true (inversion), back_mapping = true (decoder), grn = true or "
                             "cafe = true")
        return self

    @property
    def attacks(self) -> list[str]:
        """The reconstruction attacks this threat model runs on each victim."""
        return [name for name, on in (("inversion", self.white_box),
                                      ("back_mapping", self.back_mapping), ("grn", self.grn),
                                      ("cafe", self.cafe)) if on]

    def describe(self) -> str:
        """e.g. `label party: white-box inversion, back-mapping on 10 % auxiliary rows`."""
        ways = (["white-box inversion (knows the bottom model)"] if self.white_box else []) + \
            ([f"back-mapping decoder on {_percent(self.auxiliary_fraction)} auxiliary train rows"]
             if self.back_mapping else []) + \
            (["generative regression network (knows the trained model)"] if self.grn else []) + \
            (["CAFE (knows the bottom and its aggregated gradients per step)"] if self.cafe else [])
        return "label party, on received activations: " + ", ".join(ways)


def _percent(share: float) -> str:
    """A share for a report, as set: 0.004 is `0.4%` (`:.0%` made it `0%`), 0.01 `1%`."""
    return f"{100 * share:.3g}%"


def _default_parties() -> dict[str, ThreatParty]:
    return {"1": ThreatParty()}


class ThreatConfig(Settings):
    """Absent from a file: passive party 1 is curious and honest (the sidecar taps it)."""

    draws: PositiveInt = Field(5, le=1000)  # R repetitions of random side knowledge per batch
    collusion: list[list[StrictPositiveInt]] = []  # groups of parties analysed together by one attacker
    parties: dict[str, ThreatParty] = Field(default_factory=_default_parties)
    white_box: WhiteBoxConfig = WhiteBoxConfig()
    receiver: ReceiverThreat = ReceiverThreat()

    @model_validator(mode="after")
    def _groups(self) -> ThreatConfig:
        for variant in ("backdoor", "noisy", "missing"):
            parties = [k for k, p in self.parties.items() if variant in p.integrity]
            if len(parties) > 1:
                raise ValueError(f"parties {sorted(parties)} both run the '{variant}' integrity "
                                 "attack; one party per attack (its evaluation scores one party)")
        for i, group in enumerate(self.collusion):
            if len(set(group)) < 2 or len(set(group)) != len(group):
                raise ValueError(f"collusion[{i}] = {group} must name two or more distinct parties")
            strangers = [k for k in group if str(k) not in self.parties]
            if strangers:
                raise ValueError(f"collusion[{i}] names parties {strangers} that have no "
                                 f"[threat.parties.K] entry; colluding parties must be adversaries")
        return self

    def check_parties(self, passive_parties: int) -> None:
        """Party keys must be passive party ids of this run."""
        allowed = {str(k) for k in range(1, passive_parties + 1)}  # a table's keys are text
        named: dict[str, list[Any]] = {
            "threat.parties": list(self.parties),
            "threat.collusion": [k for group in self.collusion for k in group],
            "threat.receiver.victims": list(self.receiver.victims)}
        bad = [f"{field} names {sorted({k for k in keys if str(k) not in allowed}, key=str)}"
               for field, keys in named.items() if any(str(k) not in allowed for k in keys)]
        if bad:
            raise ValueError(f"{'; '.join(bad)}; this run has passive parties 1..{passive_parties}")

    def party(self, party_id: int) -> ThreatParty | None:
        return self.parties.get(str(party_id))

    @property
    def curious(self) -> list[int]:
        """Parties whose received gradients the sidecar records."""
        return sorted(int(k) for k, p in self.parties.items() if p.curious)

    @property
    def white_box_parties(self) -> list[int]:
        """Curious parties that know the label party's model (EXACT's threat model)."""
        return sorted(int(k) for k, p in self.parties.items() if p.white_box and p.curious)

    def snapshot_step(self, step: int) -> bool:
        """Whether the label party snapshots its model at train step `step` (a white-box run)."""
        every = self.white_box.every
        return step % every == 0 and step // every < self.white_box.max_snapshots

    def integrity_party(self, variant: str) -> tuple[int, Any] | None:
        """(party, settings) of the party running integrity attack `variant`, if any."""
        for k, p in self.parties.items():
            if variant in p.integrity:
                return int(k), p.integrity[variant]
        return None

    @property
    def malicious(self) -> list[int]:
        return sorted(int(k) for k, p in self.parties.items() if p.optimizer == "malicious")

    def side_seed(self, party_id: int, run_seed: int) -> int:
        """The seed of a party's random side knowledge (hints, oracle positives, labelled rows)."""
        entry = self.party(party_id)
        return run_seed if entry is None or entry.seed is None else entry.seed

    @property
    def run_units(self) -> list[tuple[int, ...]]:
        """Who runs the run-level attacks: every adversarial party, every victim of the label
        party (the reconstruction attacks), and every colluding group."""
        parties = sorted({int(k) for k in self.parties} | set(self.receiver.victims))
        return [(k,) for k in parties] + [tuple(sorted(g)) for g in self.collusion]

    def run_attacks(self, parties: tuple[int, ...]) -> list[tuple[str, dict[str, Any]]]:
        """The run-level attacks (name, params) the threat model sets up for one run unit:
        model completion where it knows labels, EXACT for a white-box party, its integrity
        attacks, and the label party's reconstructions of a victim."""
        labelled = [e.labelled_per_class for k in parties
                    if (e := self.party(k)) is not None and e.labelled_per_class]
        named: list[tuple[str, dict[str, Any]]] = []
        if labelled:
            named.append(("model_completion", {"labelled_per_class": labelled[0]}))
        if len(parties) > 1:
            return named
        (party,) = parties
        if party in self.white_box_parties:
            named.append(("exact", {}))
        entry = self.party(party)
        if entry is not None:
            named += [(INTEGRITY_ATTACKS[variant], {}) for variant in entry.integrity]
        if party in self.receiver.victims:
            named += [(name, self.receiver_params(name)) for name in self.receiver.attacks]
        return named

    def receiver_params(self, name: str) -> dict[str, Any]:
        """What [threat.receiver] gives reconstruction attack `name` (its side knowledge: the
        auxiliary rows and the rows scored); {} for another attack."""
        receiver = self.receiver
        if name in ("inversion", "back_mapping"):
            return {"auxiliary_fraction": receiver.auxiliary_fraction, "max_rows": receiver.max_rows}
        return {"max_rows": receiver.max_rows} if name in ("grn", "cafe") else {}

    def left_out(self, named: list[str], field: str) -> str | None:
        """The warning for a named attack list (`field`: attacker.attacks or --attacks) that
        leaves out run-level attacks this threat model would run; None when it leaves none."""
        missing: dict[str, list[str]] = {}
        for unit in self.run_units:
            for name, _ in self.run_attacks(unit):
                if name not in named:
                    missing.setdefault(name, []).append("+".join(map(str, unit)))
        if not missing:
            return None
        which = ", ".join(f"{name} (part{'y' if len(units) == 1 else 'ies'} {', '.join(units)})"
                          for name, units in missing.items())
        return (f"{field} names the attacks to run, so the threat model's run-level "
                f"attack{'s' if len(missing) > 1 else ''} {which} will not run; add "
                f"{', '.join(repr(n) for n in missing)} to {field} to run "
                f"{'them' if len(missing) > 1 else 'it'}, or leave {field} out to run every "
                "attack of the threat model")

    def describe(self, parties: list[int]) -> str:
        """The threat model behind one number: who attacks and how, in a few words."""
        if len(parties) > 1:
            return (f"colluding parties {'+'.join(map(str, parties))}: "
                    + "; ".join(f"{k} {self._describe_one(k)}" for k in parties))
        return self._describe_one(parties[0])

    def _describe_one(self, party_id: int) -> str:
        entry = self.party(party_id)
        return entry.describe() if entry is not None else "honest, not tapped"


def migration_message(attacker: dict[str, Any]) -> str:
    """The error for a pre-threat-model file: what moved and the exact replacement."""
    observe = attacker.get("observe", [1])
    hints = attacker.get("hints")
    parties = observe if isinstance(observe, list) and observe else [1]
    lines = []
    for k in parties:
        lines.append(f"[threat.parties.{k}]")
        lines.append("curious = true")
        if hints is not None:
            lines.append(f"hints = {list(hints) if isinstance(hints, list) else hints}")
    moved = [f"attacker.{key}" for key in ("observe", "hints") if key in attacker]
    return (f"{' and '.join(moved)} moved to the threat model: delete "
            f"{'them' if len(moved) > 1 else 'it'} from [attacker] and write instead\n"
            + "\n".join(f"      {line}" for line in lines))
