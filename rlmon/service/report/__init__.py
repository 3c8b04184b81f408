"""The run report (``rlmon report``): a run's health, cost and goodput from the history store,
as text, JSON or one self-contained HTML file."""
