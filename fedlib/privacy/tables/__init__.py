"""The privacy analyses' tables, one module per analysis of :mod:`fedlib.privacy_analyses` (the
entry's ``table_module``): each renders its own rows, header and plots from its results, through
the shared cells and writer of :mod:`fedlib.privacy.tables.common`. The bundled audit's modules
have ``write(spec, results)``, assembled by :func:`fedlib.privacy.audit_report.write_reports`; a
named target's module has the writer its report verb calls (the entry's ``writer``)."""
