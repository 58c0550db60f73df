"""What a run's analysis shows: report.md, the console tables, the plots."""
