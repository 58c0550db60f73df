"""Plug-ins from a package of one's own, installed outside the repository: found through the
`splitleak.<kind>s` entry points in every process, and refused in one sentence when broken."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import scaled, small_config, write_config
from tests.plugin_package import install

ROOT = Path(__file__).resolve().parents[1]

MODULE = '''
import numpy as np
import torch
from pydantic import Field
from attacker.attacks.base import Attack, AttackResult
from label_party.defenses.base import Defense, DefenseParams

class MaxCoord(Attack):
    name = "max_coord"
    family = "label_inference"
    side_knowledge = "none"
    def __call__(self, gradients, side):
        rows = gradients.reshape(gradients.shape[0], -1)
        return AttackResult(np.abs(rows).max(axis=1), np.zeros(rows.shape[0], dtype=bool))

class ShakeParams(DefenseParams):
    sigma: float = Field(gt=0.0)

class Shake(Defense):
    name = "shake"
    Params = ShakeParams
    def __call__(self, cut_gradient, ctx):
        return cut_gradient

class NoCall(Attack):
    name = "nocall"
    family = "label_inference"
    side_knowledge = "none"

class NoFamily(Attack):
    name = "nofamily"
    side_knowledge = "none"
    __call__ = MaxCoord.__call__

class Plain:
    name = "plain"
    family = "label_inference"
    side_knowledge = "none"
    __call__ = MaxCoord.__call__

class DictParams(MaxCoord):
    name = "dictparams"
    Params = dict
'''

PROBE = '''
from attacker.attacks import ATTACKS
from label_party.defenses import DEFENSES
from splitleak.config import ConfigError
try:
    print("ok", ATTACKS.get("max_coord").__name__, DEFENSES.get("shake").__name__)
except ConfigError as err:
    print("refused", err)
'''


def installed(tmp_path: Path, entry_points: str) -> dict[str, str]:
    """An environment whose PYTHONPATH holds a plug-in package declaring `entry_points`."""
    package = tmp_path / "pkg"
    (package / "myplugins").mkdir(parents=True)
    (package / "myplugins" / "__init__.py").write_text(MODULE)
    (package / "myplugins" / "broken.py").write_text("import module_that_does_not_exist\n")
    (package / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "myplugins"\nversion = "0.1"\n' + entry_points)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--no-index", "--target", str(site), str(package)], check=True)
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(site)])}


def probe(env: dict[str, str]) -> str:
    done = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


GOOD = ('[project.entry-points."splitleak.attacks"]\nmax_coord = "myplugins:MaxCoord"\n'
        '[project.entry-points."splitleak.defenses"]\nshake = "myplugins:Shake"\n')


def test_an_installed_attack_and_defense_are_found(tmp_path: Path) -> None:
    assert probe(installed(tmp_path, GOOD)) == "ok MaxCoord Shake"


@pytest.mark.parametrize(("entry", "says"), [
    ('bad = "myplugins.broken:X"', "cannot be imported: ModuleNotFoundError"),
    ('norm = "myplugins:MaxCoord"', "the name 'norm' is already taken by attacker.attacks.norm"),
    ('nocall = "myplugins:NoCall"', "NoCall does not implement __call__"),
    ('nofamily = "myplugins:NoFamily"', "does not set the class attribute(s) family"),
    ('other = "myplugins:MaxCoord"', "MaxCoord.name is 'max_coord'; it must be the entry point's"),
    ('plain = "myplugins:Plain"', "Plain does not subclass attacker.attacks.base.AttackPlugin, "),
    ('dictparams = "myplugins:DictParams"', "DictParams.Params is <class 'dict'>; it must be a "
                                            "subclass of attacker.attacks.base.AttackParams"),
])
def test_a_broken_installed_plugin_is_refused_in_one_sentence(tmp_path: Path, entry: str,
                                                              says: str) -> None:
    first = 'max_coord = "myplugins:MaxCoord"\n'
    entries = GOOD.replace(first, f"{first}{entry}\n")
    out = probe(installed(tmp_path, entries))
    assert out.startswith("refused attack ") and "of package 'myplugins'" in out and says in out


def test_attacker_analyze_refuses_a_broken_installed_plugin_in_one_line(tmp_path: Path) -> None:
    """The registry's refusal is a bad input to every entry point: `attacker analyze --attacks`
    printed a traceback for it."""
    env = installed(tmp_path, GOOD.replace('max_coord = "myplugins:MaxCoord"\n',
                                           'max_coord = "myplugins:MaxCoord"\n'
                                           'bad = "myplugins.broken:X"\n'))
    done = subprocess.run([sys.executable, "-m", "attacker", "analyze", str(tmp_path / "no-run"),
                           "--attacks", "max_coord"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and "cannot be imported" in done.stderr + done.stdout


def test_one_scan_of_the_installed_distributions_serves_every_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Each registry scanned every installed distribution on its first lookup: five scans
    (and a sixth for the plug-in groups) per process, ~10 ms."""
    import splitleak.registry
    from splitleak.plugins import plugin_groups
    from splitleak.registry import Registry, installed_entry_points

    scans = []
    scan = splitleak.registry.entry_points
    monkeypatch.setattr(splitleak.registry, "entry_points", lambda: scans.append(1) or scan())
    installed_entry_points.cache_clear()
    try:
        for kind in ("attack", "defense", "objective", "dataset", "protection"):
            assert Registry(kind).names() == []  # no package here declares any
        assert [group.name for group in plugin_groups.__wrapped__()] == \
            ["attacks", "objective and defense chain", "protection"]
        assert len(scans) == 1
    finally:
        installed_entry_points.cache_clear()


# A dataset and an objective of one's own, each with a `fault` parameter that breaks it in one way.
DATA_AND_OBJECTIVE = '''
import numpy as np
import torch
from pydantic import Field
from label_party.objectives.base import ObjectiveParams
from label_party.objectives.cross_entropy import CrossEntropy
from splitleak.datasets.base import Dataset, DatasetParams, FeatureSlice, Schema


class BlobsParams(DatasetParams):
    rows: int = Field(default=200, gt=1)
    columns: int = Field(default=6, gt=1)
    seed: int = 0
    fault: str = ""


class Blobs(Dataset):
    """Two Gaussian blobs, the same for every party that builds it with the same seed."""
    name = "blobs"
    Params = BlobsParams

    def __init__(self, params):
        if params.fault == "init raises":
            raise RuntimeError("no data")
        super().__init__(params)

    def table(self):
        unseeded = self.params.fault == "unseeded"
        rng = np.random.default_rng(None if unseeded else self.params.seed)
        y = rng.integers(0, 2, self.params.rows)
        x = rng.normal(size=(self.params.rows, self.params.columns)) + y[:, None]
        return x.astype(np.float32), y.astype(np.int64)

    def schema(self):
        if self.params.fault == "schema raises":
            raise RuntimeError("no schema")
        return Schema(tuple(f"x{i}" for i in range(self.params.columns)), (), (), 2,
                      self.params.rows)

    def features(self, columns):
        x, _ = self.table()
        start, stop = columns
        fault = self.params.fault
        if fault == "features raises":
            raise RuntimeError("no features")
        if fault == "features array":
            return x[:, start:stop]
        if fault == "features short":
            x = x[1:]
        if fault == "features wide":
            start, stop = (start - 1, stop) if start else (start, stop + 1)
        return FeatureSlice((start, stop), x[:, start:stop], np.zeros((len(x), 0), np.int64), ())

    def labels(self):
        y = self.table()[1]
        fault = self.params.fault
        return {"labels float": y.astype(np.float32), "labels 2d": y[:, None], "labels short": y[1:],
                "labels 1..2": y + 1}.get(fault, y)


class SmoothParams(ObjectiveParams):
    epsilon: float = Field(default=0.1, ge=0.0, lt=1.0)
    fault: str = ""


class Smooth(CrossEntropy):
    """Cross-entropy against label-smoothed targets."""
    name = "smooth"
    Params = SmoothParams

    def __init__(self, params, setup):
        if params.fault == "init raises":
            raise RuntimeError("no init")
        super().__init__(params, setup)

    @classmethod
    def check(cls, cfg, num_classes=None):
        if cfg.objective.params.get("fault") == "check raises":
            raise RuntimeError("no check")

    def summary(self):
        if self.params.fault == "summary raises":
            raise RuntimeError("no summary")
        return {}

    def targets(self, sample_ids, labels):
        return labels.float() * (1 - self.params.epsilon) + self.params.epsilon / 2

    def cut_gradients(self, activations, own, sample_ids, labels, class_gradients=False):
        result = super().cut_gradients(activations, own, sample_ids, labels, class_gradients)
        fault = self.params.fault
        if fault == "cut raises":
            raise RuntimeError("no gradients")
        if fault == "loss tensor":
            result.loss = torch.tensor(result.loss)
        if fault == "nan loss":
            result.loss = float("nan")
        changed = {"one gradient": lambda g: g[:1], "gradient shape": lambda g: [x[1:] for x in g],
                   "gradient float64": lambda g: [x.double() for x in g]}.get(fault)
        if changed is not None:
            result.gradients = changed(result.gradients)
        if fault == "class gradients":
            result.class_gradients = result.gradients[:1]
        return result

    def predict(self, activations, own):
        logits = super().predict(activations, own)
        return logits[:, 0] if self.params.fault == "logits 1d" else logits
'''

DATA_AND_OBJECTIVE_ENTRIES = {"splitleak.datasets": {"blobs": "h3plugins:Blobs"},
                              "splitleak.objectives": {"smooth": "h3plugins:Smooth"}}


def blobs_config(tmp_path: Path, dataset_fault: str = "", objective_fault: str = "",
                 max_steps: int = 3) -> dict[str, Any]:
    """A short run on the installed dataset, trained with the installed objective."""
    return small_config(tmp_path, dataset={"name": "blobs", "test_fraction": 0.25,
                                           "params": {"rows": 200, "seed": 5,
                                                      "fault": dataset_fault}},
                        features={"passive": [[0, 3], [3, 6]]},
                        model={"kind": "mlp", "layers": [8], "cut_layer": 1},
                        training={"batch_size": 32, "epochs": 1, "max_steps": max_steps,
                                  "eval_interval": 2},
                        objective={"name": "smooth", "epsilon": 0.2, "fault": objective_fault})


# What each fault is told as: "<dataset or objective in words>: <this>".
DATASET_FAULTS = {
    "init raises": "__init__() raised RuntimeError: no data (at h3plugins/__init__.py:",
    "schema raises": "schema() raised RuntimeError: no schema (at h3plugins/__init__.py:",
    "features raises": "features() raised RuntimeError: no features (at h3plugins/__init__.py:",
    "features array": "features() returned an array of dtype float32 and shape [200, 3]; it must "
                      "return a splitleak.datasets.FeatureSlice",
    "features short": "features() returned 199 rows and schema() says num_rows = 200",
    "features wide": "features() returned 4 column(s) for the range [0, 3)",
    "labels float": "labels() returned an array of dtype float32 and shape [200]; it must return "
                    "an int64 array [num_rows]",
    "labels 2d": "labels() returned an array of dtype int64 and shape [200, 1]",
    "labels short": "labels() returned 199 rows and schema() says num_rows = 200",
    "labels 1..2": "labels() returned class ids 1..2, and schema() says num_classes = 2",
    "unseeded": "two instances built from the same params return different labels(); every role "
                "builds its own",
}
OBJECTIVE_FAULTS = {
    "check raises": "check() raised RuntimeError: no check (at h3plugins/__init__.py:",
    "init raises": "__init__() raised RuntimeError: no init (at h3plugins/__init__.py:",
    "cut raises": "cut_gradients() raised RuntimeError: no gradients (at h3plugins/__init__.py:",
    "one gradient": "cut_gradients() returned 1 gradient(s) for 2 passive parties",
    "gradient shape": "cut_gradients() returned gradient 0 as torch.float32 [31, 8]; each must be "
                      "a tensor of its activation's shape and dtype (torch.float32 [32, 8])",
    "gradient float64": "cut_gradients() returned gradient 0 as torch.float64 [32, 8]",
    "loss tensor": "cut_gradients() returned a StepResult whose loss is a Tensor; it must be a float",
    "class gradients": "cut_gradients() returned 1 class gradient(s) for 2 passive parties",
    "logits 1d": "predict() returned torch.float32 [",
    "summary raises": "summary() raised RuntimeError: no summary (at h3plugins/__init__.py:",
    # Before: "... the label party's model diverged (...)", the objective unnamed.
    "nan loss": "a plug-in of one's own: check that its cut_gradients gives a finite loss",
}

FAULT_PROBE = '''
import json, sys, tempfile
from pathlib import Path
from orchestration.reference import train_in_process
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from splitleak.validation import validate
from tests.test_installed_plugins import blobs_config

def said(read_values, fault_of):
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        try:
            cfg = validate(parse_config(blobs_config(root, **fault_of)), read_values).cfg
            if read_values:
                return "valid"
            train_in_process(cfg, create_run_dir(cfg, root / "run"))
            return "trained"
        except Exception as err:
            return f"{type(err).__name__}: {err}"

for kind, fault in json.loads(sys.argv[1]):
    fault_of = {f"{kind}_fault": fault}
    print(json.dumps([f"{kind} {fault}", {"validate": said(True, fault_of),
                                          "run": said(False, fault_of)}]))
'''


@pytest.fixture(scope="module")
def fault_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """What `splitleak validate` (reading the data) and an in-process run (validated as
    `splitleak run` validates: without reading it) say of each fault, by "dataset FAULT" and
    "objective FAULT", all in one process."""
    env = install(tmp_path_factory.mktemp("site"), "h3plugins", DATA_AND_OBJECTIVE,
                  DATA_AND_OBJECTIVE_ENTRIES)
    faults = [("dataset", f) for f in DATASET_FAULTS] + [("objective", f) for f in OBJECTIVE_FAULTS]
    done = subprocess.run([sys.executable, "-c", FAULT_PROBE, json.dumps(faults)], env=env,
                          capture_output=True, text=True, timeout=scaled(300), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return dict(json.loads(line) for line in done.stdout.splitlines())


def _named(said: str, kind: str, what: str) -> bool:
    """One line naming the plug-in (dataset 'blobs' or objective 'smooth') and its package,
    then `what`."""
    name, entry = {"dataset": ("blobs", "h3plugins:Blobs"),
                   "objective": ("smooth", "h3plugins:Smooth")}[kind]
    return "\n" not in said and (f"{kind} {name!r} (splitleak.{kind}s entry point {entry!r} of "
                                 f"package 'h3plugins'): {what}") in said


@pytest.mark.parametrize("fault", sorted(DATASET_FAULTS))
def test_a_broken_installed_dataset_is_named_in_one_sentence(
        fault_reports: dict[str, dict[str, str]], fault: str) -> None:
    """A dataset plug-in that raises, or returns what the parties cannot use, is a DatasetError
    naming it and its package, one line, from `splitleak validate` (as a ConfigError) and from
    the run. Before: a traceback from deep in the loaders, or, for float or out-of-range labels
    or an unseeded generator, a run that trained on them without a word."""
    said = fault_reports[f"dataset {fault}"]
    assert said["validate"].startswith("ConfigError: dataset: ")
    assert _named(said["validate"], "dataset", DATASET_FAULTS[fault]), said
    if fault == "unseeded":  # one instance, in one process: consistent with itself
        assert said["run"] == "trained"
        return
    assert said["run"].startswith(("DatasetError: ", "ConfigError: dataset: "))
    assert _named(said["run"], "dataset", DATASET_FAULTS[fault]), said


@pytest.mark.parametrize("fault", sorted(OBJECTIVE_FAULTS))
def test_a_broken_installed_objective_is_named_in_one_sentence(
        fault_reports: dict[str, dict[str, str]], fault: str) -> None:
    """An objective plug-in that raises, or answers outside the interface (gradients: one per
    party, each of its activation's shape and dtype; a float loss; logits [B, width]), is an
    ObjectiveError naming it and its package (its config check: a ConfigError, from validate
    too). Before: a traceback (zip(), autograd, isfinite), or float64 gradients sent on
    without a word."""
    said = fault_reports[f"objective {fault}"]
    if fault == "check raises":
        assert said["validate"] == said["run"]
        assert said["run"].startswith("ConfigError: ")
    elif fault == "nan loss":  # a loss may also diverge with training: named, not blamed
        assert said["validate"] == "valid" and said["run"].startswith("NonFiniteStep: ")
        assert "the loss of train step 0 is nan" in said["run"], said
        assert "the loss is objective 'smooth' (splitleak.objectives entry point " \
            "'h3plugins:Smooth' of package 'h3plugins')" in said["run"], said
        assert OBJECTIVE_FAULTS[fault] in said["run"] and "\n" not in said["run"], said
        return
    else:
        assert said["validate"] == "valid"
        assert said["run"].startswith("ObjectiveError: ")
    assert _named(said["run"], "objective", OBJECTIVE_FAULTS[fault]), said


def _cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestration", *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=scaled(300))


def _records(root: Path, kind: str) -> list[dict]:
    from splitleak.artifacts.metrics import read_metrics
    from splitleak.artifacts.paths import RunDir

    (run,) = root.iterdir()
    return [r for r in read_metrics(RunDir(run).metrics) if r["type"] == kind]


@pytest.mark.slow
def test_a_distributed_run_on_an_installed_dataset_and_objective_equals_the_reference(
        tmp_path: Path) -> None:
    """Every role finds the package's plug-ins on PYTHONPATH (the label party its objective and
    labels, each passive party its columns, the sidecar the layout, the analysis after), and
    the wire changes no number: the in-process reference trains to the same losses."""
    env = install(tmp_path / "site", "h3plugins", DATA_AND_OBJECTIVE, DATA_AND_OBJECTIVE_ENTRIES)
    config = write_config(tmp_path, blobs_config(tmp_path, max_steps=4))
    assert _cli(env, "validate", str(config)).returncode == 0
    dist = _cli(env, "run", str(config), "--no-progress", "--output-dir", str(tmp_path / "dist"))
    assert dist.returncode == 0, dist.stdout + dist.stderr
    ref = _cli(env, "run", str(config), "--no-progress", "--in-process",
               "--output-dir", str(tmp_path / "ref"))
    assert ref.returncode == 0, ref.stdout + ref.stderr
    losses = [[r["loss"] for r in _records(tmp_path / side, "train")] for side in ("dist", "ref")]
    assert len(losses[0]) == 4
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-6, atol=1e-7)
    for d, r in zip(_records(tmp_path / "dist", "eval"), _records(tmp_path / "ref", "eval"),
                    strict=True):
        assert d["step"] == r["step"] and d["test_auc"] == pytest.approx(r["test_auc"], abs=1e-6)
    (run,) = (tmp_path / "dist").iterdir()
    assert (run / "report" / "report.md").is_file()  # the sidecar recorded, the analysis read it


@pytest.mark.slow
def test_a_distributed_run_names_an_installed_objective_that_raises_in_one_line(
        tmp_path: Path) -> None:
    """The label party ends the run with the objective's sentence and exits 2 (a broken
    installed plug-in is bad input); the orchestrator prints that sentence, not "passive party
    1 exited with code 1: ... label party internal error"."""
    env = install(tmp_path / "site", "h3plugins", DATA_AND_OBJECTIVE, DATA_AND_OBJECTIVE_ENTRIES)
    config = write_config(tmp_path, blobs_config(tmp_path, objective_fault="cut raises"))
    done = _cli(env, "run", str(config), "--no-progress", "--output-dir", str(tmp_path / "runs"))
    assert done.returncode == 2, done.stdout + done.stderr
    said = " ".join((done.stdout + done.stderr).split())  # the console wraps long lines
    assert "run failed: objective 'smooth' (splitleak.objectives entry point 'h3plugins:Smooth' " \
           "of package 'h3plugins'): cut_gradients() raised RuntimeError: no gradients" in said
    assert "Traceback" not in said and "internal error" not in said


def test_an_installed_dataset_is_not_a_built_in_one(tmp_path: Path) -> None:
    """The generated configuration page and the docs tests list the project's own datasets; with
    a researcher's package installed, its names appeared there (and the docs tests failed)."""
    from tests.plugin_package import install

    env = install(tmp_path / "site", "builtin_probe",
                  "from splitleak.datasets.wine import Wine\n\nclass Other(Wine):\n    pass\n",
                  {"splitleak.datasets": {"builtin_probe_set": "builtin_probe:Other"}})
    done = subprocess.run([sys.executable, "-c", "from splitleak.datasets import DATASETS\n"
                           "print(sorted(set(DATASETS.names()) - set(DATASETS.built_in_names())))\n"
                           "from splitleak.config_doc import configuration_page\n"
                           "print('builtin_probe_set' in configuration_page())"],
                          env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[:2] == ["['builtin_probe_set']", "False"], done.stdout
