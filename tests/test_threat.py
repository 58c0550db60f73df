"""The threat model: validation of [threat], the migration from attacker.observe, the malicious
optimizer's update rule against a hand computation, and its use by the passive party."""

from __future__ import annotations

import copy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from passive_party.bottom_trainer import bottom_optimizer
from passive_party.malicious_optimizer import MaliciousSGD
from splitleak.config import ConfigError, load_config, parse_config
from tests.conftest import small_config, write_config

SGD_1 = {"optimizers": {"1": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}}


def test_no_threat_section_is_party_one_curious_and_honest(tmp_path: Path) -> None:
    cfg = parse_config(small_config(tmp_path))
    assert cfg.threat.curious == [1] and cfg.threat.malicious == [] and cfg.tapped_parties == [1]
    assert cfg.threat.draws == 5 and cfg.threat.collusion == []
    assert cfg.threat.describe([1]) == "curious, honest"
    assert cfg.threat.side_seed(1, cfg.run.seed) == cfg.run.seed


def test_a_full_threat_model_parses_and_round_trips(tmp_path: Path) -> None:
    threat = {"draws": 3, "collusion": [[1, 2]],
              "parties": {"1": {"optimizer": "malicious", "gamma": 2.0, "clamp": [1.0, 3.0],
                                "hints": [2], "labelled_per_class": 4, "seed": 11},
                          "2": {"curious": False}}}
    cfg = parse_config(small_config(tmp_path, threat=threat, training=SGD_1))
    assert cfg.threat.curious == [1] and cfg.threat.malicious == [1]
    assert cfg.threat.side_seed(1, 3) == 11 and cfg.threat.side_seed(2, 3) == 3
    assert cfg.threat.describe([1, 2]).startswith("colluding parties 1+2: 1 curious, malicious "
                                                  "optimizer (γ=2, clamp [1, 3])")
    path = tmp_path / "resolved.toml"
    path.write_text(cfg.to_toml())
    again = load_config(path)
    assert again == cfg and again.hash == cfg.hash
    assert parse_config(small_config(tmp_path, attacker={"enabled": False})).tapped_parties == []


@pytest.mark.parametrize(("threat", "training", "message"), [
    ({"parties": {"3": {}}}, None, "threat.parties names ['3']; this run has passive parties 1..2"),
    ({"parties": {"03": {}}}, None, "threat.parties names ['03']; this run has passive parties 1..2"),
    ({"parties": {"1": {"optimizer": "malicious"}}}, None,
     "threat.parties.1.optimizer = 'malicious' is Fu et al.'s malicious SGD: party 1 trains with 'adam'"),
    ({"parties": {"1": {"optimizer": "evil"}}}, SGD_1, "'honest' or 'malicious'"),
    ({"parties": {"1": {"clamp": [5.0, 1.0]}}}, None, "clamp = [5.0, 1.0] must be [low, high]"),
    ({"parties": {"1": {"gamma": 0}}}, None, "threat.parties.1.gamma: Input should be greater than 0"),
    ({"parties": {"1": {"labelled_per_class": 0}}}, None, "labelled_per_class: Input should be greater"),
    ({"draws": 0}, None, "threat.draws: Input should be greater than 0"),
    ({"collusion": [[1, 2]]}, None, "collusion[0] names parties [2] that have no [threat.parties.K]"),
    ({"collusion": [[1, 1]], "parties": {"1": {}}}, None, "must name two or more distinct parties"),
    ({"collusion": [[1, 5]], "parties": {"1": {}, "5": {}}}, None,
     "threat.parties names ['5']; threat.collusion names [5]; this run has passive parties 1..2"),
    ({"parties": {"1": {"curious": True, "spy": 1}}}, None, "threat.parties.1.spy: Extra inputs"),
])
def test_bad_threat_model_names_field_and_allowed(tmp_path: Path, threat: dict, training: dict | None,
                                                  message: str) -> None:
    overrides = {"threat": threat, **({"training": training} if training else {})}
    with pytest.raises(ConfigError) as err:
        parse_config(small_config(tmp_path, **overrides))
    assert message in str(err.value)


def test_old_attacker_observe_gets_a_migration_error_with_the_replacement(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(small_config(tmp_path, attacker={"observe": [1, 2], "hints": [1, 3]}))
    text = str(err.value)
    assert "attacker.observe and attacker.hints moved to the threat model" in text
    for line in ("[threat.parties.1]", "[threat.parties.2]", "curious = true", "hints = [1, 3]"):
        assert line in text
    path = write_config(tmp_path, small_config(tmp_path, attacker={"observe": [2]}))
    result = subprocess.run([sys.executable, "-m", "orchestration.cli", "validate", str(path)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and "[threat.parties.2]" in result.stderr
    assert "Traceback" not in result.stderr


# --- the malicious optimizer -----------------------------------------------------------------


def _steps(optimizer: torch.optim.Optimizer, p: torch.nn.Parameter,
           grads: list[list[float]]) -> list[list[float]]:
    seen = []
    for g in grads:
        p.grad = torch.tensor(g, dtype=torch.float64)
        optimizer.step()
        seen.append(p.detach().tolist())
    return seen


def test_malicious_update_rule_by_hand() -> None:
    # lr 0.1, no momentum, γ = 1, clamp [1, 5]. Gradients g1 = (1, -2, 0.5), g2 = (2, 1, 0.5),
    # g3 = (6, 1, -1):
    # step 1: no previous step, r = 1:           p = (0, 0, 0) - 0.1 * (1, -2, 0.5) = (-0.1, 0.2, -0.05)
    # step 2: r = clamp(1 + g2 / g1) = clamp(3, 0.5, 2) = (3, 1, 2); s2 = r * g2 = (6, 1, 1)
    #         p = (-0.1, 0.2, -0.05) - 0.1 * (6, 1, 1) = (-0.7, 0.1, -0.15)
    # step 3: r = clamp(1 + g3 / s2) = clamp(2, 2, 0) = (2, 2, 1); s3 = (12, 2, -1)
    #         p = (-0.7, 0.1, -0.15) - 0.1 * (12, 2, -1) = (-1.9, -0.1, -0.05)
    p = torch.nn.Parameter(torch.zeros(3, dtype=torch.float64))
    seen = _steps(MaliciousSGD([p], lr=0.1), p, [[1, -2, 0.5], [2, 1, 0.5], [6, 1, -1]])
    expected = [[-0.1, 0.2, -0.05], [-0.7, 0.1, -0.15], [-1.9, -0.1, -0.05]]
    for got, want in zip(seen, expected, strict=True):
        assert got == pytest.approx(want, abs=1e-6)  # 1e-7 in the denominator moves the 7th digit


def test_malicious_update_rule_after_momentum_and_weight_decay_by_hand() -> None:
    # lr 0.5, momentum 0.5, weight decay 0.1, γ = 0.5, clamp [1, 1.5]; one element, p0 = 1.
    # step 1: g = 1 + 0.1 * 1 = 1.1; buffer b = 1.1; d = 1.1, r = 1; p = 1 - 0.55 = 0.45; s = 1.1
    # step 2: g = 2 + 0.1 * 0.45 = 2.045; b = 0.5 * 1.1 + 2.045 = 2.595; d = 2.595
    #         r = clamp(1 + 0.5 * 2.595 / 1.1) = clamp(2.1795...) = 1.5; s = 3.8925
    #         p = 0.45 - 0.5 * 3.8925 = -1.49625
    # The momentum buffer stays the plain SGD buffer (2.595), not the scaled step.
    p = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    optimizer = MaliciousSGD([p], lr=0.5, momentum=0.5, weight_decay=0.1, gamma=0.5, clamp=(1.0, 1.5))
    seen = _steps(optimizer, p, [[1.0], [2.0]])
    assert seen[0][0] == pytest.approx(0.45) and seen[1][0] == pytest.approx(-1.49625)
    state = optimizer.state[p]
    assert state["momentum_buffer"].item() == pytest.approx(2.595)
    assert state["scaled_direction"].item() == pytest.approx(3.8925)


def test_honest_when_ratios_clamp_to_one_is_plain_sgd() -> None:
    # Gradients alternating in sign give 1 + g_t / s_(t-1) < 1, clamped to 1: exactly torch SGD.
    grads = [[1.0, -1.0], [-1.0, 1.0], [1.0, -1.0], [-0.5, 0.5]]
    ours = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    theirs = torch.nn.Parameter(torch.zeros(2, dtype=torch.float64))
    a = _steps(MaliciousSGD([ours], lr=0.1), ours, grads)
    b = _steps(torch.optim.SGD([theirs], lr=0.1), theirs, grads)
    torch.testing.assert_close(torch.tensor(a), torch.tensor(b))


def test_malicious_state_round_trips_through_state_dict() -> None:
    torch.manual_seed(0)
    grads = [torch.randn(4, dtype=torch.float64).tolist() for _ in range(5)]
    p = torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))
    optimizer = MaliciousSGD([p], lr=0.05, momentum=0.9, gamma=1.0)
    _steps(optimizer, p, grads[:3])
    saved_p, saved = p.detach().clone(), copy.deepcopy(optimizer.state_dict())  # as torch.save would
    straight = _steps(optimizer, p, grads[3:])
    q = torch.nn.Parameter(saved_p.clone())
    resumed = MaliciousSGD([q], lr=0.05, momentum=0.9, gamma=1.0)
    resumed.load_state_dict(saved)
    assert _steps(resumed, q, grads[3:]) == straight


def test_passive_party_uses_the_malicious_optimizer_only_when_told(tmp_path: Path) -> None:
    params = [torch.nn.Parameter(torch.zeros(2))]
    threat = {"parties": {"1": {"optimizer": "malicious", "gamma": 0.5, "clamp": [1.0, 2.0]},
                          "2": {"curious": False}}}
    cfg = parse_config(small_config(tmp_path, threat=threat, training=SGD_1))
    malicious = bottom_optimizer(cfg, 1, params)
    assert isinstance(malicious, MaliciousSGD)
    group = malicious.param_groups[0]
    assert (group["lr"], group["momentum"], group["gamma"], group["clamp"]) == (0.1, 0.9, 0.5, (1.0, 2.0))
    assert type(bottom_optimizer(cfg, 2, params)) is torch.optim.Adam  # party 2 stays honest
    with pytest.raises(ValueError, match="clamp"):
        MaliciousSGD(params, clamp=(0.0, 1.0))


def test_a_named_attack_list_names_the_run_level_attacks_it_leaves_out(tmp_path: Path) -> None:
    from splitleak.validation import validate

    threat = {"collusion": [[1, 2]],
              "parties": {"1": {"labelled_per_class": 4},
                          "2": {"missing_features": {"missing_rate": 0.5}}}}
    data = small_config(tmp_path, threat=threat, attacker={"attacks": ["norm"]})
    warnings = validate(parse_config(data)).warnings
    assert ("attacker.attacks names the attacks to run, so the threat model's run-level attacks "
            "model_completion (parties 1, 1+2), missing_features (party 2) will not run; add "
            "'model_completion', 'missing_features' to attacker.attacks to run them, or leave "
            "attacker.attacks out to run every attack of the threat model") in warnings
    every = small_config(tmp_path, threat=threat)  # no list: every attack runs, nothing to say
    assert not [w for w in validate(parse_config(every)).warnings if "will not run" in w]
