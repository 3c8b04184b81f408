"""One reader per log format; each returns :class:`~rlmon.service.diagnose.logged_run.LoggedRun`."""
