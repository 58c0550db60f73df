"""Run artifacts: every path of a run or sweep directory and the typed files that cross a
process boundary (leak summary, outcome, timing, sweep index), with their readers and writers."""
