"""UCI Bank Marketing (bank-full.csv): 7 numeric, 9 categorical fields, label 1 = subscribed."""

from __future__ import annotations

from splitleak.datasets.base import DATASETS, DatasetError
from splitleak.datasets.delimited import (
    DelimitedFile,
    TextFormat,
    header_line,
    read_header,
    require_file,
)
from splitleak.datasets.text_table import TextTable

COLUMNS = (
    "age", "job", "marital", "education", "default", "balance", "housing", "loan", "contact",
    "day", "month", "duration", "campaign", "pdays", "previous", "poutcome", "y",
)  # fmt: skip
NUMERIC = ("age", "balance", "day", "duration", "campaign", "pdays", "previous")
KIND = "UCI bank-full.csv: ';'-separated, quoted header, label y last"


@DATASETS.register("bank")
class Bank(TextTable):
    """`unknown` (the file's own missing marker) is category code 0."""

    FORMAT = TextFormat(kind=KIND, names=COLUMNS, delimiter=";", header=True)
    NUMERIC = NUMERIC
    CATEGORICAL = tuple(c for c in COLUMNS if c not in NUMERIC and c != "y")
    LABEL = "y"
    LABELS = {"no": 0, "yes": 1}
    MISSING = frozenset({"unknown"})

    def _open(self) -> DelimitedFile:
        file = require_file(self.params.path, "bank-full.csv")
        header = read_header(file, KIND, ";")
        if header != COLUMNS:
            raise DatasetError(
                f"{file}, line {header_line(file)}: expected the header {';'.join(COLUMNS)} ({KIND}), "
                f"got {';'.join(header)[:200]!r}"
            )
        return DelimitedFile(file, self.FORMAT)
