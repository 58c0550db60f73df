"""UCI Spambase (spambase.data): 57 numeric fields, label 1 = spam in the last column."""

from __future__ import annotations

from splitleak.datasets.base import DATASETS
from splitleak.datasets.delimited import TextFormat
from splitleak.datasets.text_table import TextTable

WORDS = (
    "make address all 3d our over remove internet order mail receive will people report "
    "addresses free business email you credit your font 000 money hp hpl george 650 lab labs "
    "telnet 857 data 415 85 technology 1999 parts pm direct cs meeting original project re "
    "edu table conference"
).split()
NUMERIC = (
    *(f"word_freq_{word}" for word in WORDS),
    *(f"char_freq_{char}" for char in ";([!$#"),
    "capital_run_length_average",
    "capital_run_length_longest",
    "capital_run_length_total",
)


@DATASETS.register("spambase")
class Spambase(TextTable):
    FORMAT = TextFormat(
        kind="UCI spambase.data: 57 numbers then a 0/1 label, comma-separated",
        names=(*NUMERIC, "spam"),
    )
    NUMERIC = NUMERIC
    LABEL = "spam"
    LABELS = {"0": 0, "1": 1}
