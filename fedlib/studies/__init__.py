"""Studies whose reports are more than a table of rows: the domain-shift study (:mod:`fedlib.studies.domain`)."""
