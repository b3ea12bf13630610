"""The records: the store the proxy writes (schema and migrations, the writer thread, the reader,
running totals, token ids as shared prefixes, token continuity) and the data model every reader uses
(the exchange, the turn)."""
