"""The run page served at ``/`` beside ``/metrics``: a JSON API over the history store and a
static page (docs/page.md). Pure Python, read-only, never on the alert path."""
