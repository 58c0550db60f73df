"""Input protection (ALGORITHMS.md §5, Anti-GAN): its pieces against hand computations, the config
checks, and a protected run next to an unprotected one (report and comparison)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from passive_party.protection import first_conv_block
from passive_party.protections import PROTECTIONS, build_protection
from passive_party.protections.antigan import (
    mix,
    obfuscation_loss,
    pretrain_extractor,
    spread,
    window_variances,
)
from passive_party.protections.base import ProtectionFailed
from splitleak.config import ConfigError, parse_config
from splitleak.validation import validate
from tests.conftest import small_config, write_config

FAST = {"steps": 30, "pretrain_epochs": 1, "batch_size": 32}  # a few seconds, not a real GAN


def test_window_variances_by_hand() -> None:
    image = torch.tensor([[[[0.0, 2.0, 1.0, 1.0],
                            [0.0, 2.0, 1.0, 1.0],
                            [4.0, 4.0, 0.0, 0.0],
                            [4.0, 4.0, 0.0, 8.0],
                            [9.0, 9.0, 9.0, 9.0]]]])  # the fifth row holds no whole 2x2 window
    # windows: {0,2,0,2} var 1; {1,1,1,1} var 0; {4,4,4,4} var 0; {0,0,0,8} mean 2, var 12
    expected = torch.tensor([[[[1.0, 0.0], [0.0, 12.0]]]])
    assert torch.equal(window_variances(image, 2), expected)
    with pytest.raises(ValueError, match="hold no 8x8 window"):
        window_variances(image, 8)


def test_obfuscation_loss_sums_windows_and_averages_images() -> None:
    flat = torch.zeros(1, 1, 4, 4)  # four windows of variance 0: (0 - 0.5)² each
    edge = torch.tensor([[[[0.0, 1.0, 0.0, 1.0]] * 4]])  # every 2x2 window: variance 0.25
    assert obfuscation_loss(flat, 2, 0.5).item() == pytest.approx(4 * 0.25)
    assert obfuscation_loss(edge, 2, 0.5).item() == pytest.approx(4 * 0.0625)
    both = torch.cat([flat, edge])
    assert obfuscation_loss(both, 2, 0.5).item() == pytest.approx((1.0 + 0.25) / 2)


def test_mix_keeps_mu_of_the_real_image() -> None:
    real, fake = torch.full((2, 1, 2, 2), 4.0), torch.full((2, 1, 2, 2), 2.0)
    assert torch.equal(mix(real, fake, 0.25), torch.full((2, 1, 2, 2), 2.5))
    with pytest.raises(ValueError, match="cannot mix"):
        mix(real, fake[:1], 0.5)


def _block() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(),
                                       nn.MaxPool2d(2, ceil_mode=True)), nn.Flatten())


def test_the_extractor_is_a_trained_frozen_copy() -> None:
    model = _block()
    block = first_conv_block(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    images = torch.randn(40, 1, 8, 4)
    extractor = pretrain_extractor(block, images, epochs=2, lr=1e-2, seed=0)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # untouched
    assert not extractor.training and not any(p.requires_grad for p in extractor.parameters())
    assert not torch.equal(extractor[0].weight, block[0].weight)  # trained


def test_antigan_mixes_every_image_once_and_is_deterministic() -> None:
    images = torch.rand(64, 1, 8, 8) * 3 - 0.5
    protection = build_protection("antigan", FAST)
    first = protection(images, first_conv_block(_block()), seed=7)
    again = protection(images, first_conv_block(_block()), seed=7)
    other = protection(images, first_conv_block(_block()), seed=8)
    assert torch.equal(first.images, again.images) and not torch.equal(first.images, other.images)
    generated = (first.images - 0.5 * images) / 0.5  # x̂ = μx + (1 − μ)G(z), G in the data range
    assert generated.min() >= images.min() - 1e-5 and generated.max() <= images.max() + 1e-5
    f = first.figures
    assert f["rows"] == 64 and set(f["final_losses"]) == {"discriminator", "generator", "obfuscation"}
    assert f["pixel_spread"]["real"] == pytest.approx(spread(images))
    assert f["window_variance"]["real"] == pytest.approx(float(window_variances(images, 4).mean()))


def test_a_diverged_generator_is_named_not_sent_on() -> None:
    """lr = 1e30 (its only bound is > 0) gave NaN images, and the run failed later on the label
    party's refusal of NaN activations, naming neither Anti-GAN nor its lr."""
    images = torch.rand(64, 1, 8, 8)
    protection = build_protection("antigan", {**FAST, "steps": 2, "lr": 1e30})
    with pytest.raises(ProtectionFailed, match=r"antigan diverged: .* after 2 steps at lr = 1e\+30"):
        protection(images, first_conv_block(_block()), seed=7)


DIVERGING = {**FAST, "steps": 2, "lr": 1e30, "pretrain_epochs": 0}


def test_a_party_whose_protection_diverged_stops_saying_so(tmp_path: Path) -> None:
    """The party failed with a traceback (ValueError escaping run_party) before it joined."""
    import asyncio

    from passive_party.client import PartyError, run_party
    from splitleak.artifacts.paths import RunDir

    cfg = parse_config(_protected(tmp_path, params=DIVERGING))
    run = RunDir(tmp_path / "run")
    run.root.mkdir()
    with pytest.raises(PartyError, match="antigan diverged"):
        asyncio.run(run_party(cfg, 1, "127.0.0.1:1", run))


def test_an_in_process_run_whose_protection_diverged_fails_in_one_sentence(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from orchestration.cli import main
    from tests.test_cli_refusals import exit_code_and_text

    config = write_config(tmp_path, _protected(tmp_path, params=DIVERGING))
    code, text = exit_code_and_text(main, ["run", str(config), "--in-process", "--no-progress"],
                                    capsys)
    assert code == 1 and "Traceback" not in text, text
    assert "antigan diverged" in " ".join(text.split()), text


def test_the_registry_names_what_is_allowed() -> None:
    assert PROTECTIONS.names() == ["antigan"]
    with pytest.raises(KeyError, match=r"unknown protection 'antign' \(did you mean 'antigan'\?\); "
                                       "allowed: antigan"):
        build_protection("antign", {})


def _protected(tmp_path: Path, **protection: object) -> dict:
    return small_config(
        tmp_path, dataset={"name": "digits", "test_fraction": 0.2},
        features={"passive": [[0, 4], [4, 8]]},
        model={"kind": "cnn", "channels": [8], "layers": [32], "cut_layer": 1},
        training={"batch_size": 64, "epochs": 2, "eval_interval": 0},
        threat={"parties": {"2": {"curious": True}}, "receiver": {"victims": [1]}},
        protection={"name": "antigan", "parties": [1], "params": FAST, **protection})


@pytest.mark.parametrize(("change", "message"), [
    ({"parties": [3]}, r"protection.parties names \[3\]; this run has passive parties 1..2"),
    ({"parties": [1, 1]}, r"names a party twice"),
    ({"parties": []}, "needs protection.parties"),
    ({"name": "none"}, "protection.parties / params are set but protection.name = 'none'"),
])
def test_the_config_says_what_is_wrong(tmp_path: Path, change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        validate(parse_config(_protected(tmp_path, **change)))


def test_a_protection_needs_a_cnn(tmp_path: Path) -> None:
    data = _protected(tmp_path)
    data["model"] = {"kind": "mlp", "layers": [16], "cut_layer": 1}
    with pytest.raises(ConfigError, match="needs model.kind = 'cnn'"):
        validate(parse_config(data))


@pytest.mark.parametrize(("change", "message"), [
    ({"name": "antign"}, r"protection.name: unknown protection 'antign' \(did you mean "
                         r"'antigan'\?\); allowed: antigan, none"),
    ({"params": {"mix": 1.5}}, r"protection.params.mix"),
    ({"params": {"windows": 4}}, r"protection.params.windows"),
    # a batch of 1 passed, then the party failed on the generator's BatchNorm (exit 1)
    ({"params": {"batch_size": 1}}, r"protection.params.batch_size.*greater than or equal to 2"),
    # a window wider than the party's 8x4 half passed, then the party failed the run (exit 1)
    ({"params": {"window": 5}}, r"protection.params.window = 5: the party's images of 8x4 pixels "
                                r"hold no 5x5 window \(allowed: 2..4\) \(party 1\)"),
])
def test_validation_checks_the_plugin(tmp_path: Path, change: dict, message: str) -> None:
    from splitleak.validation import validate

    cfg = parse_config(_protected(tmp_path, **change))
    with pytest.raises(ConfigError, match=message):
        validate(cfg)


def test_a_protected_run_trains_on_mixed_images_and_says_so(tmp_path: Path) -> None:
    """In-process: party 1's received activations differ from an unprotected run's from the
    first step; protection.json, report.md's section and the comparison's relative drop (ADR)
    are there."""
    from attacker.analysis.analyze import analyze
    from attacker.analysis.summary import write_summary
    from attacker.report.report import write_report
    from orchestration.compare.read import find_runs
    from orchestration.compare.table import compare
    from orchestration.reference import run_reference
    from splitleak.artifacts.rundir import create_run_dir
    from tests.runs import logged

    runs = {}
    for name, data in (("plain", _protected(tmp_path, name="none", parties=[], params={})),
                       ("protected", _protected(tmp_path))):
        cfg = parse_config(data)
        runs[name] = create_run_dir(cfg, tmp_path / name)
        run_reference(cfg, runs[name])
    plain, protected = (logged(runs[n], "received")[1] for n in ("plain", "protected"))
    assert (plain[0][3]["activation"] != protected[0][3]["activation"]).any()
    figures = json.loads(runs["protected"].protection(1).read_text())
    assert figures["name"] == "antigan" and figures["params"]["lambda_obf"] == 250.0
    assert not runs["protected"].protection(2).exists() and not runs["plain"].protection(1).exists()
    for run in runs.values():
        summary = analyze(run.root, [("back_mapping", {"steps": 50})])
        write_summary(run, summary)
        write_report(run, summary)
    report = (runs["protected"].report / "report.md").read_text()
    assert "## Input protection" in report and "antigan on party 1" in report
    assert "## Input protection" not in (runs["plain"].report / "report.md").read_text()
    found, warnings = find_runs([runs["plain"].root, runs["protected"].root])
    assert not warnings and len(found) == 2
    rows = compare(found, layer="input").rows
    by_setting = {r["family"]: r for r in rows}
    assert set(by_setting) == {"no defense", "antigan"}
    row = by_setting["antigan"]
    assert row["metric"] == "ssim" and row["attack_type"] == "feature reconstruction"
    base = by_setting["no defense"]["utility_mean"]
    assert row["relative_drop_mean"] == pytest.approx((base - row["utility_mean"]) / base)
    assert row["leak_mean"] == pytest.approx(row["leak_accuracy_mean"])


@pytest.mark.slow
def test_a_protected_distributed_run_equals_the_reference_and_resumes(tmp_path: Path) -> None:
    """Party 1 protects in its own process exactly as the reference does; a run interrupted and
    resumed (party 1 protects again, from the same seed) ends bit for bit like an uninterrupted one."""
    import asyncio

    from splitleak.artifacts.paths import RunDir
    from splitleak.artifacts.rundir import write_config
    from tests.live import whole_run
    from tests.runs import assert_same_run, distributed_and_reference

    data = _protected(tmp_path, params={**FAST, "steps": 60})
    data["training"] |= {"checkpoint_every": 5}
    distributed, reference = distributed_and_reference(tmp_path, data)
    assert_same_run(distributed, reference, parties=2)
    assert distributed.protection(1).read_text() != ""

    cfg = parse_config(data)
    runs = {}
    for name in ("straight", "interrupted"):
        runs[name] = RunDir(tmp_path / name)
        runs[name].root.mkdir()
        write_config(cfg, runs[name])
    assert asyncio.run(whole_run(cfg, runs["straight"].root))[0]["status"] == "ok"
    outcome, _ = asyncio.run(whole_run(cfg, runs["interrupted"].root, interrupt_at=12))
    assert outcome["status"] == "interrupted"
    outcome, errors = asyncio.run(whole_run(cfg, runs["interrupted"].root, resume=True))
    assert outcome["status"] == "ok" and errors == [None, None]
    assert_same_run(runs["straight"], runs["interrupted"], parties=2)
