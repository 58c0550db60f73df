"""UCI Adult (adult.data / adult.test): 6 numeric, 8 categorical fields, label 1 = income >50K."""

from __future__ import annotations

from splitleak.datasets.base import DATASETS
from splitleak.datasets.delimited import TextFormat
from splitleak.datasets.text_table import TextTable

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week",
    "native-country", "income",
)  # fmt: skip
NUMERIC = ("age", "fnlwgt", "education-num", "capital-gain", "capital-loss", "hours-per-week")


@DATASETS.register("adult")
class Adult(TextTable):
    """`?` is a missing category (code 0). adult.test's first line and trailing dots are fine,
    and so is a header row naming the columns in order (Kaggle's adult.csv: `age,workclass,...,
    income`, no spaces, `educational-num` and `gender`)."""

    FORMAT = TextFormat(
        kind="UCI adult.data: 15 comma+space-separated columns, income last",
        names=COLUMNS,
        strip=True,
        preamble="|",  # adult.test starts with "|1x3 Cross validator"
    )
    NUMERIC = NUMERIC
    CATEGORICAL = tuple(c for c in COLUMNS if c not in NUMERIC and c != "income")
    LABEL = "income"
    LABELS = {"<=50K": 0, ">50K": 1, "<=50K.": 0, ">50K.": 1}
    MISSING = frozenset({"?"})
    HEADER_FIRST = "age"
    SPELLINGS = {"educational-num": "education-num", "gender": "sex"}  # Kaggle's adult.csv
