"""`self.log`: the logged values' bookkeeping, where they go, and the table printed after validate/test."""
