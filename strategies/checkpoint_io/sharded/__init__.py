"""Sharded (ZeRO-2/3) checkpoint folders: the manifest, local and remote saves and loads, async saves and
consolidation into one file."""
