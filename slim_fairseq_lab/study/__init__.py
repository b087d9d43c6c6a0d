"""The quality-per-parameter study behind scripts/quality.py: its options, runs, planner,
scheduler, summary statistics, report and plots."""
