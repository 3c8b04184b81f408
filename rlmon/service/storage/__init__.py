"""Storage: the embedded SQLite history of finalized steps, alerts and worst samples."""
