"""The CIFAR-10 / CIFAR-100 readers on binary-version files the tests write, and a KD^k run on one."""

from __future__ import annotations

import gzip
import tomllib
from pathlib import Path

import numpy as np
import pytest

from attacker.analysis.analyze import analyze
from orchestration.reference import run_reference
from orchestration.sweep.overrides import apply
from splitleak.artifacts.rundir import create_run_dir
from splitleak.config import parse_config
from splitleak.datasets import DatasetError, build_dataset

EXAMPLES = Path(__file__).parent.parent / "examples" / "threat" / "cifar10"


def records(labels: list[list[int]], seed: int = 0) -> tuple[bytes, np.ndarray]:
    """Binary-version records (label bytes, then 1,024 R, G, B bytes each, row by row) and the
    images they hold as [n, 3, 32, 32]."""
    pixels = np.random.default_rng(seed).integers(0, 256, (len(labels), 3, 32, 32), dtype=np.uint8)
    rows = [bytes(label) + image.tobytes() for label, image in zip(labels, pixels, strict=True)]
    return b"".join(rows), pixels


def write_cifar10(folder: Path, train: int, test: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """data_batch_1.bin and test_batch.bin with labels cycling 0..9; (images, labels) in order."""
    folder.mkdir(parents=True, exist_ok=True)
    labels = [i % 10 for i in range(train + test)]
    data, pixels = records([[y] for y in labels], seed)
    record = 1 + 3072
    (folder / "data_batch_1.bin").write_bytes(data[: train * record])
    (folder / "test_batch.bin").write_bytes(data[train * record:])
    return pixels, np.array(labels)


def test_cifar10_reads_records_as_images_split_by_pixel_columns(tmp_path: Path) -> None:
    pixels, labels = write_cifar10(tmp_path / "cifar-10-batches-bin", train=7, test=3)
    dataset = build_dataset("cifar10", {"path": str(tmp_path / "cifar-10-batches-bin")})
    schema = dataset.schema()
    assert (schema.num_rows, schema.num_classes, schema.image_shape) == (10, 10, (3, 32, 32))
    assert schema.num_columns == 32
    assert dataset.labels().tolist() == labels.tolist()  # train batches first, then the test batch
    left, right = dataset.features((0, 16)), dataset.features((16, 32))
    assert left.numeric.shape == (10, 3, 32, 16) and left.numeric.dtype == np.float32
    np.testing.assert_allclose(left.numeric, pixels[..., :16] / 255.0, rtol=1e-6)
    np.testing.assert_allclose(right.numeric, pixels[..., 16:] / 255.0, rtol=1e-6)
    # the channel planes in the file's order: red first (byte 1..1024 of a record)
    raw = (tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin").read_bytes()
    assert left.numeric[0, 0, 0, 1] == pytest.approx(raw[1 + 1] / 255.0)
    assert left.numeric[0, 2, 31, 15] == pytest.approx(raw[1 + 2048 + 31 * 32 + 15] / 255.0)
    single = build_dataset("cifar10", {"path": str(tmp_path / "cifar-10-batches-bin" / "test_batch.bin")})
    assert single.labels().tolist() == labels[7:].tolist()
    capped = build_dataset("cifar10", {"path": str(tmp_path / "cifar-10-batches-bin"), "max_rows": 8})
    assert capped.schema().num_rows == 8 and capped.labels().tolist() == labels[:8].tolist()  # 7 + 1


def test_cifar100_takes_the_fine_or_the_coarse_label(tmp_path: Path) -> None:
    data, pixels = records([[19, 99], [0, 5], [7, 42]])
    (tmp_path / "train.bin").write_bytes(data)
    fine = build_dataset("cifar100", {"path": str(tmp_path)})
    assert fine.schema().num_classes == 100 and fine.labels().tolist() == [99, 5, 42]
    coarse = build_dataset("cifar100", {"path": str(tmp_path), "label": "coarse"})
    assert coarse.schema().num_classes == 20 and coarse.labels().tolist() == [19, 0, 7]
    np.testing.assert_allclose(fine.features((10, 20)).numeric, pixels[..., 10:20] / 255.0, rtol=1e-6)


@pytest.mark.parametrize(("name", "content", "params", "message"), [
    ("cifar10", None, {"path": "missing"}, "missing does not exist"),
    ("cifar10", None, {"path": "/dev/null"}, "exists but is not a regular file"),
    ("cifar10", {}, {}, "holds none of data_batch_1.bin"),
    ("cifar10", {"data_batch_1.bin": b"\x01" * 3072}, {}, "not a whole number of 3,073-byte"),
    ("cifar10", {"data_batch_1.bin": b""}, {}, "0 bytes"),
    ("cifar10", {"test_batch.bin": bytes([3]) + bytes(3072) + bytes([10]) + bytes(3072)}, {},
     "record 2 has label 10; CIFAR-10 binary version labels are 0..9"),
    ("cifar100", {"train.bin": bytes([1, 100]) + bytes(3072)}, {}, "labels are 0..99"),
    ("cifar100", {"train.bin": bytes([20, 3]) + bytes(3072)}, {"label": "coarse"}, "labels are 0..19"),
    ("cifar100", {"train.bin": bytes([4, 7]) + bytes(3072)
                  + bytes([5, 150]) + bytes(3072)}, {"label": "coarse"},
     "record 2 has fine label 150; CIFAR-100 binary version fine labels are 0..99"),  # unused, corrupt
    ("cifar100", {"train.bin": bytes(3073)}, {}, "3,074-byte CIFAR-100"),
    # the archive as downloaded: it said '146 bytes is not a whole number of 3,073-byte CIFAR-10
    # binary version records ...; is it the binary version (.bin)?', which it is
    ("cifar10", {"cifar-10-binary.tar.gz": gzip.compress(bytes(3073 * 2))},
     {"path": "data/cifar-10-binary.tar.gz"},
     "cifar-10-binary.tar.gz is gzip-compressed .*: unpack it .* and give the folder it makes"),
])
def test_bad_files_name_the_file_and_what_is_allowed(tmp_path: Path, name: str,
                                                     content: dict[str, bytes] | None,
                                                     params: dict, message: str) -> None:
    folder = tmp_path / "data"
    if content is not None:
        folder.mkdir()
        for file, data in content.items():
            (folder / file).write_bytes(data)
    path = str(tmp_path / params.pop("path")) if "path" in params else str(folder)  # absolute: itself
    with pytest.raises(DatasetError, match=message):
        build_dataset(name, {"path": path, **params}).schema()


def test_a_tar_archive_is_named_and_black_images_are_records(tmp_path: Path) -> None:
    """The unpacked-to-tar archive (cifar-10-binary.tar) given as the path was read as records
    when its size happened to fit; a file starting with 512 zero bytes (label 0, a black first
    rows of red) is records, not an empty archive."""
    import tarfile

    black = tmp_path / "data_batch_1.bin"
    black.write_bytes(bytes(3073 * 10))
    assert build_dataset("cifar10", {"path": str(black)}).schema().num_rows == 10
    archive = tmp_path / "cifar-10-binary.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(black, arcname="cifar-10-batches-bin/data_batch_1.bin")
    with pytest.raises(DatasetError, match="cifar-10-binary.tar is a tar archive .*: unpack it"):
        build_dataset("cifar10", {"path": str(archive)}).schema()


def test_an_unreadable_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "test_batch.bin").write_bytes(bytes(3073))

    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(np, "fromfile", denied)
    with pytest.raises(DatasetError, match="test_batch.bin: cannot read CIFAR-10 binary version "
                                           "records: .*Permission denied"):
        build_dataset("cifar10", {"path": str(tmp_path)}).schema()


def test_cifar10_examples_train_and_analyse_on_a_file_in_the_binary_layout(tmp_path: Path) -> None:
    """Fu et al.'s / KD^k's CIFAR-10 set-up as shipped, shrunk to a few steps on 200 written rows:
    the label party's teacher, the 3-channel halves and model completion all run."""
    write_cifar10(tmp_path / "cifar", train=150, test=50)
    data = tomllib.loads((EXAMPLES / "cifar10-kdk-active.toml").read_text())
    for path, value in [("dataset.params.path", str(tmp_path / "cifar")),
                        ("dataset.params.max_rows", None), ("run.output_dir", str(tmp_path / "runs")),
                        ("training.epochs", 1), ("training.max_steps", 3),
                        ("objective.teacher_epochs", 1)]:
        data = apply(data, path, value)
    cfg = parse_config(data)
    run = create_run_dir(cfg)
    run_reference(cfg, run)
    summary = analyze(run.root, [("model_completion", {"steps": 3, "baselines": False})])
    entry = next(e for e in summary["leak"] if e["layer"] == "bottom")
    assert entry["threat"].startswith("curious, malicious optimizer")
    assert entry["completion"]["labelled"] == 40 and entry["completion"]["test"]["rows"] > 0


def test_a_folders_files_the_loader_does_not_read_are_not_the_runs_data(tmp_path: Path) -> None:
    """A readme or stray file in the CIFAR folder was recorded as the run's data: a party whose
    copy of it differed was refused at join, and touching it refused a resume."""
    from splitleak.artifacts.manifest import DataFile
    from splitleak.data_files import data_changes, data_digests, data_files, data_paths
    from tests.conftest import small_config

    folder = tmp_path / "cifar"
    folder.mkdir()
    write_cifar10(folder, 40, 10)
    (folder / "readme.html").write_text("the archive's readme")
    cfg = parse_config(small_config(tmp_path, dataset={"name": "cifar10",
                                                       "params": {"path": str(folder)}}))
    key = "dataset.params.path"
    read = {f"{key}/data_batch_1.bin", f"{key}/test_batch.bin"}
    assert set(data_paths(cfg)) == set(data_files(cfg)) == set(data_digests(cfg)) == read
    # a checkpoint of an earlier version that recorded the readme still resumes
    recorded = data_files(cfg) | {f"{key}/readme.html": DataFile(
        path=str(folder / "readme.html"), size=1, mtime_ns=1)}
    assert data_changes(recorded, cfg) == []
    (folder / "test_batch.bin").write_bytes(b"")
    assert data_changes(recorded, cfg) == [f"{folder / 'test_batch.bin'} holds 0 bytes, not "
                                           f"{recorded[f'{key}/test_batch.bin'].size}"]
